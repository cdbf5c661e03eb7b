"""Stochastic uplift of the end-to-end chain: a noise-conditioned encoder and an MC-dropout processor.

Encoder branch, E(x; a) = mu(x) + sigma(x) * a in the paper's reading, made concrete as
    a   ~ N(0, I)                     (rows, L, noise_dim), per patch, from an explicit generator
    e   = MLP(a)                      (rows, L, D), Linear(noise_dim, D) -> GELU -> Linear(D, D)
    film:  every LayerNorm of the ViT (each block's two, and the final one) -> FiLMLayerNorm conditioned on e,
           the same e at every block (film.py; scale/shift zero-initialised)
    embed: tokens += e once before the first block (MLP's last Linear zero-initialised)
Invariant: at initialisation either variant returns the wrapped deterministic ObsEncoder's output bit for
bit, for any draw a; finetuning with the fair CRPS moves it off that point.

Members as a batch dimension: forward(..., members=M) turns b samples into b*M rows, member-major within a
sample: row i*M + m is member m of sample i (sample i's members are rows i*M .. i*M+M-1, contiguous, so
`split_members(y, M)` is a view (b, M, ...)). The observation embedding and PixelMLP run once per sample; the
ViT runs once over all b*M rows. Draws:
    noise_generator = torch.Generator     one draw of shape (b*M, L, noise_dim): reproducible for the batch
    noise_generator = RowGenerators       row r's noise from generator r: each member reproducible alone
    noise = tensor (b*M, L, noise_dim)    explicit draws (e.g. held fixed while other sources vary)
With RowGenerators, one forward over (b x M) equals M separate forwards given those rows' generators.

Processor branch (MC dropout), per lead step, everything in eval mode but the dropout:
    proc = mc_dropout(processor, p=0.05)             # ValueError unless 0 <= p < 1
    z = tile_members(z0, N)                          # (b*M*N, ...): row (i*M + m)*N + n
    gens = RowGenerators.from_seeds(seeds)           # one per row (or one torch.Generator for all rows)
    for lead in ...: z = step(proc(z, generator=gens))   # masks redrawn at every call: generators advance
Same generator states -> same masks -> same members; p = 0 -> all members equal.

RowGenerators draw row by row (a Python loop per draw): on a GPU create them on the model's device
(`RowGenerators.from_seeds(seeds, device="cuda")`); one torch.Generator is the fast path where single members
need not be replayed alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.nn as nn
from torch import Tensor

from wxray.models.blocks import Dropout, RowGenerators, enable_mc_dropout, normal
from wxray.models.e2e import ObsEncoder
from wxray.models.film import FiLMConditioning, condition_layernorms

NOISE_MODES = ("film", "embed")


def tile_members(x: Tensor, members: int) -> Tensor:
    """(b, ...) -> (b*M, ...), row i*M + m a copy of sample i (sample i's members contiguous)."""
    if members < 1:
        raise ValueError(f"members must be >= 1, got {members}")
    return x if members == 1 else x.repeat_interleave(members, dim=0)


def split_members(y: Tensor, members: int) -> Tensor:
    """(b*M, ...) -> (b, M, ...): the inverse layout of tile_members, for a loss over member_dim=1."""
    if members < 1 or y.shape[0] % members:
        raise ValueError(f"{y.shape[0]} rows do not split into groups of members={members}")
    return y.unflatten(0, (-1, members))


class StochasticEncoder(nn.Module):
    """Noise-conditioned ObsEncoder (module docstring); wraps `encoder` in place and owns it as `self.encoder`.

    With noise="film" the encoder's LayerNorms become FiLMLayerNorms (same Parameters, same state-dict keys),
    so the wrapped encoder can no longer be called on its own: deepcopy it first if you need both. Load the
    deterministic weights into `encoder` before wrapping. The backbone must run dense (keep_ratio 1, as
    ObsEncoder builds it) for film.
    """

    def __init__(self, encoder: ObsEncoder, noise: str = "film", noise_dim: int = 32):
        super().__init__()
        if noise not in NOISE_MODES:
            raise ValueError(f"noise must be one of {', '.join(NOISE_MODES)}, got {noise!r}")
        if noise_dim < 1:
            raise ValueError(f"noise_dim must be >= 1, got {noise_dim}")
        self.noise, self.noise_dim = noise, noise_dim
        backbone = encoder.backbone
        dim = backbone.tokenizer.dim
        self.n_tokens = backbone.grid[0] * backbone.grid[1]
        param = next(backbone.parameters())
        self.noise_mlp = nn.Sequential(nn.Linear(noise_dim, dim), nn.GELU(), nn.Linear(dim, dim)).to(param.device)
        self.conditioning: FiLMConditioning | None = None
        if noise == "film":
            self.conditioning = condition_layernorms(backbone, dim)
        else:
            nn.init.zeros_(self.noise_mlp[-1].weight)
            nn.init.zeros_(self.noise_mlp[-1].bias)
        self.encoder = encoder

    def draw_noise(
        self, rows: int, generator: torch.Generator | RowGenerators | None = None, device: torch.device | None = None
    ) -> Tensor:
        """a ~ N(0, I), (rows, L, noise_dim) float32 on `device`; drawn on the generator's device (blocks.normal)."""
        device = device if device is not None else next(self.noise_mlp.parameters()).device
        return normal((rows, self.n_tokens, self.noise_dim), generator, device)

    def forward(
        self,
        obs: Mapping[str, Tensor],
        static: Tensor | None = None,
        deny: Sequence[str] = (),
        generator: torch.Generator | RowGenerators | None = None,
        noise_generator: torch.Generator | RowGenerators | None = None,
        members: int = 1,
        noise: Tensor | None = None,
        keep: Tensor | None = None,
    ) -> Tensor:
        """obs + static for b samples -> (b*members, n_out, h, w), rows member-major within a sample.

        `generator` drives the encoder's own dropout (if any) over the b*members rows, `noise_generator` the
        noise a; `noise`, if given, is a itself (b*members, L, noise_dim) and `noise_generator` is unused.
        `keep` (b, n_streams) withholds streams per sample (ObsEncoder.embed); a sample's members share it.
        """
        if members < 1:
            raise ValueError(f"members must be >= 1, got {members}")
        x = tile_members(self.encoder.features(obs, static, deny, keep), members)
        rows = x.shape[0]
        if noise is None:
            noise = self.draw_noise(rows, noise_generator, x.device)
        elif tuple(noise.shape) != (rows, self.n_tokens, self.noise_dim):
            raise ValueError(
                f"noise must be (b*members, L, noise_dim) = {(rows, self.n_tokens, self.noise_dim)}, "
                f"got {tuple(noise.shape)}"
            )
        e = self.noise_mlp(noise.to(x.dtype))
        if self.conditioning is not None:
            self.conditioning.value = e  # kept after forward: checkpointed blocks recompute with it
            return self.encoder.backbone(x, generator=generator)
        return self.encoder.backbone(x, generator=generator, tokens_add=e)


def set_dropout(model: nn.Module, p: float) -> nn.Module:
    """Set the rate of every wxray Dropout in `model` to p (not DropPath); ValueError unless 0 <= p < 1."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout p must be in [0, 1), got {p}")
    layers = [m for m in model.modules() if isinstance(m, Dropout)]
    if not layers:
        raise ValueError(f"{type(model).__name__} has no wxray Dropout modules to set")
    for m in layers:
        m.p = float(p)
    return model


def mc_dropout(model: nn.Module, p: float | None = None) -> nn.Module:
    """MC-dropout inference: model.eval(), then only its Dropout/DropPath modules active; optionally set p first.

    Masks come from the generator passed to each forward (a torch.Generator for all rows, or RowGenerators, one
    per member row), so every call (every lead step) draws new masks and the same states replay them.
    """
    if p is not None:
        set_dropout(model, p)
    model.eval()
    return enable_mc_dropout(model)
