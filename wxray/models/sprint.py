"""Sprint-style baseline (Park et al. 2025), the comparison point of Sec. 2.2 / 3.2.

Same tokenizer, blocks and head as Res-Slim-ViT; only the sparse stage differs. The middle blocks see
the K selected tokens, the dropped positions are filled with one learnable mask token, and the result
is fused with the dense-early features: x' = Linear(concat(x_early, filled)). Unlike the residual
delta, no token keeps its pre-routing value, which is the discontinuity the paper argues against.
With keep_ratio == 1 the router is the plain dense loop and the fusion layer is unused.

Mixed precision: the fused output is cast back to the residual stream's dtype. Under autocast the Linear
returns bf16, which would otherwise carry the whole dense-late stage in bf16 while Res-Slim's scatter_add
keeps it in fp32; the comparison must differ in the sparse stage only, not in precision.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn as nn
from torch import Tensor

from wxray.models.reslim import ResSlimViT
from wxray.models.routing import SparseRouter
from wxray.models.selectors import RoutingContext, TokenSelector


class SprintRouter(SparseRouter):
    def __init__(
        self,
        blocks: Sequence[nn.Module],
        split: Sequence[int],
        keep_ratio: float = 1.0,
        selection: str | TokenSelector = "random",
        deterministic: bool = False,
        dim: int | None = None,
    ):
        if dim is None:
            raise ValueError("SprintRouter needs the token dimension (dim) for its mask token and fusion")
        super().__init__(blocks, split, keep_ratio, selection, deterministic, dim)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, dim))
        nn.init.trunc_normal_(self.mask_token, std=0.02)
        self.fuse = nn.Linear(2 * dim, dim)

    def sparse_stage(
        self,
        x0: Tensor,
        indices: Tensor,
        generator: torch.Generator | None = None,
        context: RoutingContext | None = None,
        token_kwargs: Sequence[str] = (),
        block_kwargs: dict | None = None,
    ) -> Tensor:
        _, h = self.run_middle(x0, indices, generator, token_kwargs, block_kwargs)
        filled = self.mask_token.expand_as(x0).scatter(1, indices.unsqueeze(-1).expand_as(h), h)
        return self.fuse(torch.cat([x0, filled], dim=-1)).to(x0.dtype)


class SprintViT(ResSlimViT):
    """ResSlimViT with the Sprint sparse stage; same constructor and forward."""

    router_cls = SprintRouter
