"""Res-Slim-ViT (Eq. 2, Algorithm 1): a ViT on per-variable tokens plus a CNN skip path.

x (B, H*V_in + V_const, h, w), channels history-major: [t0 v0..vN, t1 v0..vN, ..., constants]
tokens = VarAgg(PatchEmbed(x) + e_var) + p_pos + p_res          (B, L, D), L = (h/p)(w/p)
p_pos: an L x D table, learned from a 2-D sin-cos start (default) or the fixed sin-cos buffer
tokens = SparseRouter(blocks)(tokens)                           dense-early / sparse / dense-late
y = Unpatchify(MLP_head(LN(tokens))) + CNN_skip(x)              (B, V_out, h, w)
forward(..., tokens_add=t) adds t (B, L, D) to the tokens before the router (the stochastic encoder's hook).
The tokenizer, trunk and head are `backbone.py`'s, shared with the generative ResSlimEDM.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from wxray.models.backbone import ResSlimBackbone, Tokenizer
from wxray.models.blocks import Block
from wxray.models.routing import SparseRouter
from wxray.models.selectors import RoutingContext, TokenSelector


class ResSlimViT(ResSlimBackbone):
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
        img_size = self.check_shape(n_vars, history, n_const, n_out, img_size, patch_size, embed_dim, depth,
                                    num_heads, drop_path, dropout)
        self.periodic_longitude = periodic_longitude
        self.in_channels = n_vars * history + n_const
        self.tokenizer = Tokenizer(n_vars, history, n_const, img_size, patch_size, embed_dim, num_heads, pos_embed)
        self.build_trunk(Block, self.tokenizer.grid, embed_dim, depth, num_heads, mlp_ratio, split, keep_ratio,
                         selection, dropout, drop_path, self.in_channels, cnn_skip, skip_channels,
                         router_cls=self.router_cls, deterministic=deterministic_eval)

    def embed(self, x: Tensor, generator: torch.Generator | None = None) -> Tensor:
        return self.embed_drop(self.tokenizer(x), generator)

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
