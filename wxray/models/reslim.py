"""Res-Slim-ViT (Eq. 2, Algorithm 1): a ViT on per-variable tokens plus a CNN skip path.

x (B, H*V_in + V_const, h, w), channels history-major: [t0 v0..vN, t1 v0..vN, ..., constants]
tokens = VarAgg(PatchEmbed(x) + e_var) + p_pos + p_res          (B, L, D), L = (h/p)(w/p)
p_pos: an L x D table, learned from a 2-D sin-cos start (default) or the fixed sin-cos buffer
tokens = SparseRouter(blocks)(tokens)                           dense-early / sparse / dense-late
y = Unpatchify(MLP_head(LN(tokens))) + CNN_skip(x)              (B, V_out, h, w)
forward(..., tokens_add=t) adds t (B, L, D) to the tokens before the router (the stochastic encoder's hook).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn as nn
from torch import Tensor

from wxray.models.blocks import Block, Dropout
from wxray.models.routing import SparseRouter
from wxray.models.selectors import RoutingContext, TokenSelector


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


class ResSlimViT(nn.Module):
    """Deterministic forecaster. forward(x, generator=None, routing_generator=None) -> (B, n_out, h, w).

    `generator` drives every random draw (token selection, dropout, drop path); with the same
    generator state two forward passes are bit-identical. `routing_generator`, if given, takes over
    the token selection alone. `deterministic_eval=True` makes random selection one fixed seeded draw
    in eval mode (the score-based selections are deterministic anyway). `pos_embed`: see Tokenizer.
    `periodic_longitude`: the grid's first and last columns are neighbours (a global grid), which field-based
    token scores (laplacian, gradient) respect; False for a regional box. Set
    `activation_checkpointing = True` to recompute each block in backward; replayability is kept
    (see routing._checkpointed).
    """

    router_cls: type[SparseRouter] = SparseRouter

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
        selection: str | TokenSelector = "random",
        deterministic_eval: bool = False,
        drop_path: float = 0.0,
        dropout: float = 0.0,
        cnn_skip: bool = True,
        skip_channels: int = 64,
        pos_embed: str = "learned",
        periodic_longitude: bool = True,
    ):
        super().__init__()
        img_size = tuple(int(s) for s in img_size)
        self.periodic_longitude = periodic_longitude
        _validate(n_vars, history, n_const, n_out, img_size, patch_size, embed_dim, depth, num_heads)
        if not 0.0 <= drop_path < 1.0 or not 0.0 <= dropout < 1.0:
            raise ValueError(f"drop_path ({drop_path}) and dropout ({dropout}) must be in [0, 1)")
        self.n_vars, self.history, self.n_const, self.n_out = n_vars, history, n_const, n_out
        self.img_size, self.patch_size = img_size, patch_size
        self.in_channels = n_vars * history + n_const

        self.tokenizer = Tokenizer(n_vars, history, n_const, img_size, patch_size, embed_dim, num_heads, pos_embed)
        self.grid = self.tokenizer.grid
        self.embed_drop = Dropout(dropout)
        # stochastic depth grows linearly with depth (DeiT rule): early blocks are rarely skipped
        rates = torch.linspace(0.0, drop_path, depth).tolist()
        blocks = [Block(embed_dim, num_heads, mlp_ratio, dropout=dropout, drop_path=r) for r in rates]
        split = tuple(split) if split is not None else default_split(depth)
        self.router = self.router_cls(
            blocks, split, keep_ratio, selection, deterministic=deterministic_eval, dim=embed_dim
        )
        n_tokens = self.grid[0] * self.grid[1]
        if self.router.sparse and self.router.num_selected(n_tokens) < 1:
            raise ValueError(f"keep_ratio {keep_ratio} selects no tokens out of L={n_tokens}")
        self.norm = nn.LayerNorm(embed_dim)
        self.head = nn.Sequential(
            nn.Linear(embed_dim, embed_dim), nn.GELU(), nn.Linear(embed_dim, patch_size**2 * n_out)
        )
        self.skip = CNNSkip(self.in_channels, n_out, patch_size, skip_channels) if cnn_skip else None
        self.apply(_init_weights)

    @property
    def activation_checkpointing(self) -> bool:
        return self.router.activation_checkpointing

    @activation_checkpointing.setter
    def activation_checkpointing(self, on: bool) -> None:
        self.router.activation_checkpointing = bool(on)

    def embed(self, x: Tensor, generator: torch.Generator | None = None) -> Tensor:
        return self.embed_drop(self.tokenizer(x), generator)

    def decode(self, tokens: Tensor) -> Tensor:
        """(B, L, D) -> (B, n_out, h, w)."""
        B = tokens.shape[0]
        (gh, gw), p = self.grid, self.patch_size
        y = self.head(self.norm(tokens)).view(B, gh, gw, p, p, self.n_out)
        return y.permute(0, 5, 1, 3, 2, 4).reshape(B, self.n_out, gh * p, gw * p)

    def forward(
        self,
        x: Tensor,
        generator: torch.Generator | None = None,
        routing_generator: torch.Generator | None = None,
        tokens_add: Tensor | None = None,
    ) -> Tensor:
        """x -> y; `tokens_add` (B, L, D), if given, is added to the token embeddings before the first block."""
        if x.ndim != 4 or x.shape[1] != self.in_channels or tuple(x.shape[2:]) != self.img_size:
            raise ValueError(
                f"expected input (B, {self.in_channels}, {self.img_size[0]}, {self.img_size[1]}), "
                f"got {tuple(x.shape)}"
            )
        tokens = self.embed(x, generator)
        if tokens_add is not None:
            if tokens_add.shape != tokens.shape:
                raise ValueError(f"tokens_add must be (B, L, D) = {tuple(tokens.shape)}, got {tuple(tokens_add.shape)}")
            tokens = tokens + tokens_add
        context = RoutingContext(fields=x, grid=self.grid, n_dynamic=self.in_channels - self.n_const,
                                 periodic=self.periodic_longitude)
        tokens = self.router(
            tokens, generator=generator, context=context, routing_generator=routing_generator
        )
        y = self.decode(tokens)
        if self.skip is not None:
            y = y + self.skip(x)
        return y


def _validate(
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


def _init_weights(m: nn.Module) -> None:
    if isinstance(m, nn.Linear):
        nn.init.trunc_normal_(m.weight, std=0.02)
        if m.bias is not None:
            nn.init.zeros_(m.bias)
