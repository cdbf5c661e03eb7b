"""The Res-Slim trunk that the forecaster (ResSlimViT) and the generative denoiser (ResSlimEDM) share.

tokens (B, L, D) -> SparseRouter(blocks)                       dense-early / sparse / dense-late
y = Unpatchify(MLP_head(LN(tokens))) [+ CNN_skip(x)]           (B, n_out, h, w)

plus the pieces both tokenize with: per-variable patch embedding with variable aggregation (Eq. 1), the 2-D
sin-cos position table, the CNN skip path. A model subclasses `ResSlimBackbone`, checks its shape
(`check_shape`), builds its own tokenizer(s), then `build_trunk` (embedding dropout, blocks, router, head,
skip) and the trunk's weight init: in that order, so weights drawn under one seed stay those of the model
before the trunk was shared.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn as nn
from torch import Tensor

from wxray.models.blocks import Dropout
from wxray.models.routing import SparseRouter
from wxray.models.selectors import TokenSelector


def sincos_pos_embed_2d(dim: int, grid_h: int, grid_w: int) -> Tensor:
    """(1, grid_h * grid_w, dim) fixed 2-D sin-cos embedding: half the channels per axis, row-major."""
    if dim % 4 != 0:
        raise ValueError(f"embed_dim {dim} must be divisible by 4 for the 2-D sin-cos position embedding")
    freqs = 1.0 / 10000 ** (torch.arange(dim // 4, dtype=torch.float64) / (dim // 4))

    def axis(n: int) -> Tensor:
        angles = torch.arange(n, dtype=torch.float64)[:, None] * freqs[None, :]
        return torch.cat([angles.sin(), angles.cos()], dim=1)  # (n, dim / 2)

    rows = axis(grid_h)[:, None, :].expand(grid_h, grid_w, dim // 2)
    cols = axis(grid_w)[None, :, :].expand(grid_h, grid_w, dim // 2)
    return torch.cat([rows, cols], dim=-1).reshape(1, grid_h * grid_w, dim).float()


def default_split(depth: int) -> tuple[int, int, int]:
    """The paper's (2, N-4, 2) pattern, shrunk to (1, N-2, 1) / all-middle for shallow stacks."""
    n = 2 if depth >= 6 else 1 if depth >= 3 else 0
    return (n, depth - 2 * n, n)


class VariableAggregation(nn.Module):
    """Eq. 1: per position, cross-attention from one shared learned query to that position's V tokens.

    softmax(q k_v / sqrt(hd)) over the V variables, per head, as two einsums. Not through
    scaled_dot_product_attention: the fused kernels put the B * L positions on one CUDA grid dimension
    (at most 65535), which real grids pass (8 x 8192 tokens at 1.4 deg fails), and one query over a
    handful of keys gains nothing from them.
    """

    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.query = nn.Parameter(torch.zeros(1, 1, dim))
        nn.init.trunc_normal_(self.query, std=0.02)
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, tokens: Tensor) -> Tensor:
        B, V, L, D = tokens.shape
        hd = D // self.num_heads
        k, v = self.kv(tokens).view(B, V, L, 2, self.num_heads, hd).unbind(3)  # (B, V, L, heads, hd) each
        q = self.q(self.query).view(self.num_heads, hd) * hd**-0.5
        weights = torch.einsum("hd,bvlhd->blhv", q, k).softmax(dim=-1)
        out = torch.einsum("blhv,bvlhd->blhd", weights.to(v.dtype), v)
        return self.proj(out.reshape(B, L, D))


class Tokenizer(nn.Module):
    """Per-variable patch embedding + variable embedding + aggregation + position/resolution embedding.

    "One Conv2d per variable" is done as a single grouped conv (groups = variables), which is the same
    computation in one kernel launch. Each dynamic variable's conv sees its H history channels.

    pos_embed="learned" (default) makes p_pos an L x D parameter initialised to the sin-cos table: the
    paper's text says sinusoidal, but its parameter counts include an L x D table. "fixed" keeps the
    sin-cos table as a non-persistent buffer (no parameters, nothing in the state dict).
    """

    def __init__(
        self,
        n_vars: int,
        history: int,
        n_const: int,
        img_size: tuple[int, int],
        patch_size: int,
        dim: int,
        num_heads: int,
        pos_embed: str = "learned",
    ):
        super().__init__()
        self.n_vars, self.n_const, self.dim = n_vars, n_const, dim
        self.patch_size = patch_size
        self.grid = (img_size[0] // patch_size, img_size[1] // patch_size)
        # input channel t * n_vars + v -> variable-major order [v0 t0..tH, v1 t0..tH, ...] for the groups
        order = [t * n_vars + v for v in range(n_vars) for t in range(history)]
        self.register_buffer("order", torch.tensor(order, dtype=torch.long), persistent=False)
        p = patch_size
        self.var_patch = nn.Conv2d(n_vars * history, n_vars * dim, p, stride=p, groups=n_vars)
        self.const_patch = nn.Conv2d(n_const, n_const * dim, p, stride=p, groups=n_const) if n_const else None
        self.var_embed = nn.Parameter(torch.zeros(1, n_vars + n_const, 1, dim))
        nn.init.trunc_normal_(self.var_embed, std=0.02)
        self.aggregate = VariableAggregation(dim, num_heads)
        table = sincos_pos_embed_2d(dim, *self.grid)
        if pos_embed == "learned":
            self.pos_embed = nn.Parameter(table)
        elif pos_embed == "fixed":
            self.register_buffer("pos_embed", table, persistent=False)
        else:
            raise ValueError(f"pos_embed must be 'learned' or 'fixed', got {pos_embed!r}")
        # one grid per model, so the resolution embedding of ORBIT-style models is a single learned vector
        self.res_embed = nn.Parameter(torch.zeros(1, 1, dim))

    def forward(self, x: Tensor) -> Tensor:
        B = x.shape[0]
        n_dyn = x.shape[1] - self.n_const
        patches = [self.var_patch(x[:, :n_dyn].index_select(1, self.order))]
        if self.const_patch is not None:
            patches.append(self.const_patch(x[:, n_dyn:]))
        p = torch.cat(patches, dim=1)  # (B, V*D, gh, gw), variable-major
        p = p.view(B, self.n_vars + self.n_const, self.dim, -1).transpose(2, 3)  # (B, V, L, D)
        return self.aggregate(p + self.var_embed) + self.pos_embed + self.res_embed


class CNNSkip(nn.Module):
    """Conv (stride p) -> PixelShuffle(p) -> Conv on the full input: a cheap local path beside the ViT.

    The strided conv + pixel shuffle keeps the output on the input grid while giving each output pixel
    a p x p sub-pixel filter bank; it is linear by design, the ViT supplies the nonlinear long range.
    """

    def __init__(self, in_ch: int, out_ch: int, patch_size: int, hidden: int):
        super().__init__()
        s = patch_size
        self.conv_in = nn.Conv2d(in_ch, hidden * s * s, 3, stride=s, padding=1)
        self.shuffle = nn.PixelShuffle(s)
        self.conv_out = nn.Conv2d(hidden, out_ch, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv_out(self.shuffle(self.conv_in(x)))


class ResSlimBackbone(nn.Module):
    """Shape checks, routed blocks, head and CNN skip of a Res-Slim model; `decode` maps tokens to fields."""

    def check_shape(self, n_vars: int, history: int, n_const: int, n_out: int, img_size: Sequence[int],
                    patch_size: int, embed_dim: int, depth: int, num_heads: int, drop_path: float,
                    dropout: float) -> tuple[int, int]:
        """Validate the constructor's shape arguments and keep them; returns img_size as a tuple."""
        img_size = tuple(int(s) for s in img_size)
        validate_shape(n_vars, history, n_const, n_out, img_size, patch_size, embed_dim, depth, num_heads)
        if not 0.0 <= drop_path < 1.0 or not 0.0 <= dropout < 1.0:
            raise ValueError(f"drop_path ({drop_path}) and dropout ({dropout}) must be in [0, 1)")
        self.n_vars, self.history, self.n_const, self.n_out = n_vars, history, n_const, n_out
        self.img_size, self.patch_size = img_size, patch_size
        return img_size

    def build_trunk(self, block_cls: type[nn.Module], grid: tuple[int, int], embed_dim: int, depth: int,
                    num_heads: int, mlp_ratio: float, split: Sequence[int] | None, keep_ratio: float,
                    selection: str | TokenSelector, dropout: float, drop_path: float, skip_in: int,
                    cnn_skip: bool, skip_channels: int, router_cls: type[SparseRouter] = SparseRouter,
                    **router_kwargs) -> None:
        """Embedding dropout, the blocks (stochastic depth growing linearly: DeiT), the router, LayerNorm +
        MLP head, the CNN skip from `skip_in` channels; then the trunk's weight init over the whole model."""
        self.grid = grid
        self.embed_drop = Dropout(dropout)
        rates = torch.linspace(0.0, drop_path, depth).tolist()
        blocks = [block_cls(embed_dim, num_heads, mlp_ratio, dropout=dropout, drop_path=r) for r in rates]
        split = tuple(split) if split is not None else default_split(depth)
        self.router = router_cls(blocks, split, keep_ratio, selection, dim=embed_dim, **router_kwargs)
        n_tokens = grid[0] * grid[1]
        if self.router.sparse and self.router.num_selected(n_tokens) < 1:
            raise ValueError(f"keep_ratio {keep_ratio} selects no tokens out of L={n_tokens}")
        self.norm = nn.LayerNorm(embed_dim)
        self.head = nn.Sequential(
            nn.Linear(embed_dim, embed_dim), nn.GELU(), nn.Linear(embed_dim, self.patch_size**2 * self.n_out)
        )
        self.skip = CNNSkip(skip_in, self.n_out, self.patch_size, skip_channels) if cnn_skip else None
        self.apply(init_weights)

    @property
    def activation_checkpointing(self) -> bool:
        return self.router.activation_checkpointing

    @activation_checkpointing.setter
    def activation_checkpointing(self, on: bool) -> None:
        self.router.activation_checkpointing = bool(on)

    def decode(self, tokens: Tensor) -> Tensor:
        """(B, L, D) -> (B, n_out, h, w)."""
        B = tokens.shape[0]
        (gh, gw), p = self.grid, self.patch_size
        y = self.head(self.norm(tokens)).view(B, gh, gw, p, p, self.n_out)
        return y.permute(0, 5, 1, 3, 2, 4).reshape(B, self.n_out, gh * p, gw * p)


def validate_shape(
    n_vars: int,
    history: int,
    n_const: int,
    n_out: int,
    img_size: tuple[int, ...],
    patch_size: int,
    embed_dim: int,
    depth: int,
    num_heads: int,
) -> None:
    if n_vars < 1 or history < 1 or n_const < 0 or n_out < 1:
        raise ValueError(
            f"need n_vars >= 1, history >= 1, n_const >= 0, n_out >= 1; "
            f"got {n_vars}, {history}, {n_const}, {n_out}"
        )
    if len(img_size) != 2 or min(img_size) < 1:
        raise ValueError(f"img_size must be two positive ints (h, w), got {img_size}")
    if patch_size < 1 or img_size[0] % patch_size or img_size[1] % patch_size:
        raise ValueError(f"patch_size {patch_size} does not divide img_size {img_size}")
    if depth < 1 or num_heads < 1:
        raise ValueError(f"depth ({depth}) and num_heads ({num_heads}) must be >= 1")
    if embed_dim % num_heads:
        raise ValueError(f"embed_dim {embed_dim} is not divisible by num_heads {num_heads}")
    if embed_dim % 4:
        raise ValueError(f"embed_dim {embed_dim} must be divisible by 4 (2-D sin-cos position embedding)")


def init_weights(m: nn.Module) -> None:
    if isinstance(m, nn.Linear):
        nn.init.trunc_normal_(m.weight, std=0.02)
        if m.bias is not None:
            nn.init.zeros_(m.bias)
