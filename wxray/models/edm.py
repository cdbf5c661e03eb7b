"""Res-Slim-EDM: the generative forecaster (Sec. 3.1 Eq. 4-6, Sec. 3.4 Algorithm 2), EDM of Karras et al. 2022.

    D(y; sigma, c) = c_skip(sigma) y + c_out(sigma) F(c_in(sigma) y; sigma, c)                    (Eq. 4)
    F = Unpatchify(MLP_head(LN(ViT_edm(Z_x, Z_c, e_sigma)))) + CNN_skip(c_in y)                    (Eq. 5)
    Z_x = VarAgg(PatchEmbed(c_in y)) + p_pos + p_res + p_time                                      (B, L, D)
    Z_c = TemporalProj(concat_t [VarAgg(PatchEmbed(c_t, constants)) + p_pos + p_res + e_time[t]])  (B, L, D)
    e_sigma = MLP(SiLU(MLP(ln(sigma) / 4)))                                                        (B, D)
    ViT_edm = SparseRouter over EDMBlocks, split (n1, n2, n3): the n2 middle blocks run on K = floor(r L)
              routed tokens of Z_x (self-attention K x K, cross-attention K queries x L keys of Z_c),
              then x' = x0 + Scatter(h - h0) (residual delta; unselected tokens keep their values).

y (B, n_out, h, w) is the noisy target Y + sigma n; c (B, n_vars * history + n_const, h, w) the history
frames, history-major as for ResSlimViT ([t0 v0..vN, t1 v0..vN, ..., constants], oldest first).

Routing is held per sample: `draw_routing(B, generator)` returns the (B, K) selection (one independent
random draw per sample); passing the same tensor as `routing=` to every denoiser call of a trajectory
keeps the selection fixed across all denoising steps of each sample (Sec. 3.2, "routing is applied
identically across all denoising steps"); edm_sampler does exactly this. With routing=None every
forward draws a fresh selection from `generator` (training). keep_ratio == 1 is the dense EDM.
Wherever a generator is taken, a blocks.RowGenerators (one generator per batch row) may stand in for it:
row b's noise, routing and dropout then come from generator b alone (a member replayable on its own).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn as nn
from torch import Tensor

from wxray.models.backbone import ResSlimBackbone, Tokenizer
from wxray.models.blocks import RowGenerators, normal
from wxray.models.compiled import host_checks
from wxray.models.edm_blocks import EDMBlock, NoiseEmbedding
from wxray.models.losses import lat_weighted_mse
from wxray.models.selectors import RandomSelector, RoutingContext


class Precond(NamedTuple):
    c_skip: Tensor
    c_out: Tensor
    c_in: Tensor
    c_noise: Tensor


def precond(sigma: Tensor, sigma_data: float) -> Precond:
    """EDM preconditioning (Karras et al. 2022, Table 1), element-wise in sigma >= 0:

        c_skip = sigma_data^2 / (sigma^2 + sigma_data^2)
        c_out  = sigma sigma_data / sqrt(sigma^2 + sigma_data^2)
        c_in   = 1 / sqrt(sigma^2 + sigma_data^2)
        c_noise = ln(sigma) / 4

    Invariant: for Var(Y) = sigma_data^2, both the network input c_in y and its effective target
    (Y - c_skip y) / c_out have unit variance. At sigma = 0, c_skip = 1 and c_out = 0 exactly, so
    D(y; 0) = y; c_noise then uses the smallest positive float instead of 0 and stays finite.
    """
    s2, d2 = sigma.square(), sigma_data**2
    root = (s2 + d2).sqrt()
    tiny = torch.finfo(sigma.dtype).tiny
    return Precond(d2 / (s2 + d2), sigma * sigma_data / root, 1.0 / root, sigma.clamp_min(tiny).log() / 4)


def loss_weight(sigma: Tensor, sigma_data: float) -> Tensor:
    """lambda(sigma) = (sigma^2 + sigma_data^2) / (sigma sigma_data)^2 = 1 / c_out^2 (Eq. 6)."""
    return (sigma.square() + sigma_data**2) / (sigma * sigma_data).square()


@dataclass
class HeldRouting(RoutingContext):
    """RoutingContext that carries a selection drawn beforehand: indices (B, K), or None to draw one."""

    indices: Tensor | None = None


class HeldRandomSelector(RandomSelector):
    """Random selection (Algorithm 2, line 13) that returns the caller's held indices when it has them.

    Held indices must be (B, K) with K = floor(r L), sorted strictly ascending (hence distinct) and in
    [0, L): `ResSlimEDM.draw_routing` makes them with this selector's own draw.
    """

    def select(
        self,
        x: Tensor,
        k: int,
        generator: torch.Generator | RowGenerators | None = None,
        context: RoutingContext | None = None,
    ) -> Tensor:
        held = getattr(context, "indices", None)
        if held is None:
            return super().select(x, k, generator, context)
        B, L = x.shape[:2]
        if held.shape != (B, k) or held.dtype != torch.long:
            raise ValueError(f"routing must be a (B, K) = ({B}, {k}) long tensor, got {tuple(held.shape)} {held.dtype}")
        held = held.to(x.device)
        ok = (held[:, 0] >= 0).all() & (held[:, -1] < L).all() & (held[:, 1:] > held[:, :-1]).all()
        if host_checks(held) and not bool(ok):
            raise ValueError(f"routing indices must be sorted, distinct and in [0, {L})")
        return held


class ConditionTokenizer(nn.Module):
    """Z_c (B, L, D) from the history: each frame (its n_vars fields + the constants) goes through one
    shared Tokenizer (per-variable patch embedding, VarAgg, p_pos, p_res), gets the learned embedding
    e_time[t] of its history step, and a Linear over the concatenated H frames (TemporalProj) mixes them.

    p_pos and p_res enter before the projection, so Z_c carries W p_pos rather than p_pos; the table is
    learned, so this is the same family of embeddings. Calendar time is not an input.
    """

    def __init__(self, n_vars: int, history: int, n_const: int, img_size: tuple[int, int], patch_size: int,
                 dim: int, num_heads: int, pos_embed: str = "learned"):
        super().__init__()
        self.n_vars, self.history, self.n_const = n_vars, history, n_const
        self.frame = Tokenizer(n_vars, 1, n_const, img_size, patch_size, dim, num_heads, pos_embed)
        self.time_embed = nn.Parameter(torch.zeros(history, dim))
        nn.init.trunc_normal_(self.time_embed, std=0.02)
        self.proj = nn.Linear(history * dim, dim)

    def forward(self, cond: Tensor) -> Tensor:
        B, _, h, w = cond.shape
        H, V, C = self.history, self.n_vars, self.n_const
        frames = cond[:, : H * V].reshape(B * H, V, h, w)  # row b * H + t: sample b, history step t
        if C:
            consts = cond[:, H * V :].unsqueeze(1).expand(B, H, C, h, w).reshape(B * H, C, h, w)
            frames = torch.cat([frames, consts], dim=1)
        tokens = self.frame(frames).view(B, H, -1, self.time_embed.shape[1]) + self.time_embed[None, :, None]
        return self.proj(tokens.permute(0, 2, 1, 3).flatten(2))  # (B, L, H * D) -> (B, L, D)


class ResSlimEDM(ResSlimBackbone):
    """EDM denoiser with Sparse-Reslim middle blocks. forward(y, sigma, cond, generator=None, routing=None).

    The trunk (blocks, router, head, CNN skip, shape checks) is ResSlimViT's (`backbone.ResSlimBackbone`).
    Constructor: ResSlimViT's arguments (so build_model("edm", ...) takes the same config) plus
    `sigma_data` (std of the normalised target fields; 1.0 for standardised data). `selection` must be
    "random": a score-based selection would read the tokens, which change with sigma, and could not be
    held fixed across the denoising steps. `periodic_longitude` is accepted for config compatibility
    and unused by random selection. `deterministic_eval=True`: in eval mode every selection is one fixed
    seeded draw shared by all samples. `local_condition=True` also adds Z_c to Z_x token by token (not in
    the paper, whose conditioning enters through the cross-attention alone): the token at a location then
    sees that location's history without first learning to find it among the L conditioning tokens.

    forward -> D(y; sigma, cond) (B, n_out, h, w); sigma: float, 0-d or (B,) tensor, >= 0. `generator`
    drives dropout, drop path and (routing=None) the token selection. `routing`: (B, K) from
    `draw_routing`, held across a trajectory; must be None for a dense model.
    """

    def __init__(
        self,
        n_vars: int,
        history: int,
        n_const: int,
        n_out: int,
        img_size: Sequence[int],
        patch_size: int,
        embed_dim: int,
        depth: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        split: Sequence[int] | None = None,
        keep_ratio: float = 1.0,
        selection: str = "random",
        deterministic_eval: bool = False,
        drop_path: float = 0.0,
        dropout: float = 0.0,
        cnn_skip: bool = True,
        skip_channels: int = 64,
        pos_embed: str = "learned",
        periodic_longitude: bool = True,
        sigma_data: float = 1.0,
        local_condition: bool = False,
    ):
        super().__init__()
        if selection != "random":
            raise ValueError(
                f"edm supports selection='random' only (held fixed across denoising steps), got {selection!r}"
            )
        img_size = self.check_shape(n_vars, history, n_const, n_out, img_size, patch_size, embed_dim, depth,
                                    num_heads, drop_path, dropout)
        if not sigma_data > 0:
            raise ValueError(f"sigma_data must be > 0, got {sigma_data}")
        self.sigma_data = float(sigma_data)
        self.local_condition = bool(local_condition)
        self.periodic_longitude = periodic_longitude
        self.cond_channels = n_vars * history + n_const

        self.target_tokenizer = Tokenizer(n_out, 1, 0, img_size, patch_size, embed_dim, num_heads, pos_embed)
        grid = self.target_tokenizer.grid
        self.num_tokens = grid[0] * grid[1]
        self.target_time = nn.Parameter(torch.zeros(1, 1, embed_dim))  # p_time of the target frame
        nn.init.trunc_normal_(self.target_time, std=0.02)
        self.condition = ConditionTokenizer(n_vars, history, n_const, img_size, patch_size, embed_dim,
                                            num_heads, pos_embed)
        self.noise_embed = NoiseEmbedding(embed_dim)
        self.build_trunk(EDMBlock, grid, embed_dim, depth, num_heads, mlp_ratio, split, keep_ratio,
                         HeldRandomSelector(deterministic=deterministic_eval), dropout, drop_path, n_out, cnn_skip,
                         skip_channels)
        self.noise_embed.reset_parameters()
        for block in self.router.blocks:
            block.zero_init()

    @property
    def num_routed(self) -> int:
        """K, the tokens each middle block sees (L when dense)."""
        return self.router.num_selected(self.num_tokens) if self.router.sparse else self.num_tokens

    def draw_routing(
        self,
        batch_size: int,
        generator: torch.Generator | RowGenerators | None = None,
        device: torch.device | str | None = None,
    ) -> Tensor | None:
        """(B, K) sorted token indices, one independent random selection per sample; None if dense.

        Draw once per sample (per trajectory) and pass it as `routing=` to every denoiser call of that
        trajectory. Uses the router's selector, so the draw is the one a routing=None forward would make.
        """
        if not self.router.sparse:
            return None
        dummy = torch.empty(batch_size, self.num_tokens, 0, device=device)
        return self.router.selector.select(dummy, self.num_routed, generator)

    def sigma_vector(self, sigma: float | Tensor, batch_size: int, device: torch.device) -> Tensor:
        """sigma as a float32 (B,) tensor on `device` (a float or 0-d tensor is broadcast)."""
        s = torch.as_tensor(sigma, dtype=torch.float32, device=device)
        s = s.expand(batch_size) if s.ndim == 0 else s.reshape(-1)
        if s.shape != (batch_size,):
            raise ValueError(f"sigma must be a scalar or have {batch_size} entries, got shape {tuple(s.shape)}")
        return s

    def raw(
        self,
        x_in: Tensor,
        c_noise: Tensor,
        cond: Tensor,
        generator: torch.Generator | RowGenerators | None = None,
        routing: Tensor | None = None,
    ) -> Tensor:
        """F(c_in y; sigma, c) of Eq. 5, for x_in = c_in y (B, n_out, h, w) and c_noise (B,)."""
        emb = self.noise_embed(c_noise)
        z_c = self.condition(cond)
        z_x = self.target_tokenizer(x_in) + self.target_time
        if self.local_condition:
            z_x = z_x + z_c
        z_x = self.embed_drop(z_x, generator)
        z_x = self.router(z_x, generator=generator, context=HeldRouting(indices=routing), cond=z_c, emb=emb)
        f = self.decode(z_x)
        return f if self.skip is None else f + self.skip(x_in)

    def forward(
        self,
        y: Tensor,
        sigma: float | Tensor,
        cond: Tensor,
        generator: torch.Generator | RowGenerators | None = None,
        routing: Tensor | None = None,
    ) -> Tensor:
        B = y.shape[0]
        if y.ndim != 4 or y.shape[1] != self.n_out or tuple(y.shape[2:]) != self.img_size:
            raise ValueError(
                f"expected y (B, {self.n_out}, {self.img_size[0]}, {self.img_size[1]}), got {tuple(y.shape)}"
            )
        if cond.shape != (B, self.cond_channels, *self.img_size):
            raise ValueError(
                f"expected cond ({B}, {self.cond_channels}, {self.img_size[0]}, {self.img_size[1]}), "
                f"got {tuple(cond.shape)}"
            )
        if routing is not None and not self.router.sparse:
            raise ValueError("routing given to a dense model (keep_ratio 1 or no middle blocks)")
        sigma = self.sigma_vector(sigma, B, y.device)
        if host_checks(sigma) and bool((sigma < 0).any()):
            raise ValueError("sigma must be >= 0")
        c_skip, c_out, c_in, c_noise = (c.view(B, 1, 1, 1) for c in precond(sigma, self.sigma_data))
        f = self.raw(c_in * y, c_noise.view(B), cond, generator, routing)
        return c_skip * y + c_out * f


def edm_loss(
    model: ResSlimEDM,
    target: Tensor,
    cond: Tensor,
    lat_weights: Tensor,
    generator: torch.Generator | RowGenerators | None,
    p_mean: float = -1.2,
    p_std: float = 1.2,
    var_weights: Tensor | None = None,
    crop: Callable[[Tensor], Tensor] | None = None,
) -> Tensor:
    """Eq. 6: mean_b lambda(sigma_b) ||D(Y_b + sigma_b n_b; sigma_b, c_b) - Y_b||^2_lat, a scalar.

    ln sigma_b ~ N(p_mean, p_std^2) per sample; lambda(sigma) = (sigma^2 + sigma_data^2) / (sigma sigma_data)^2;
    ||.||^2_lat is Eq. 3's latitude-weighted MSE (losses.lat_weighted_mse, optional var_weights), applied to
    sqrt(lambda_b) (D_b - Y_b) so each sample carries its own weight. Draws, in this order, from
    `generator`: ln sigma (B,), n (B, V, h, w), then the model's own (routing, dropout). `model` may be
    wrapped (FSDP2 keeps its attributes, DDP's `.module` has them); sigma_data is read from it. `crop`
    maps the model grid to the scored region (e.g. cut padded rows and columns) before the mean;
    `lat_weights` then weights that region's rows.
    """
    B = target.shape[0]
    sigma = (p_mean + p_std * normal((B,), generator, target.device)).exp()
    noise = normal(tuple(target.shape), generator, target.device, target.dtype)
    y = target + sigma.view(B, 1, 1, 1) * noise
    denoised = model(y, sigma, cond, generator=generator).float()  # the loss in fp32 under bf16 autocast
    sigma_data = getattr(model, "module", model).sigma_data
    root = loss_weight(sigma, sigma_data).sqrt().view(B, 1, 1, 1)
    pred, truth = root * denoised, root * target
    if crop is not None:
        pred, truth = crop(pred), crop(truth)
    return lat_weighted_mse(pred, truth, lat_weights, var_weights)

