"""SparseRouter: dense-early / sparse-middle / dense-late execution of a block stack (Sec. 3.2).

The router only knows that a block maps tokens (B, n, D) -> (B, n, D) for any n and is called as
`block(x, generator=generator, **block_kwargs)`. Everything else a block needs (conditioning tokens,
a noise embedding for EDM blocks) goes through `**block_kwargs` untouched, so the same router drives
Res-Slim-ViT, ClimaX-style and generative blocks.

Residual delta (Eq. 9): x' = x0 + Scatter(h - h0). The scatter is an out-of-place `scatter_add` onto
x0, so unselected tokens leave the sparse stage bit-for-bit equal to their pre-routing values.

Selectors read the dense-early stage only through what its blocks return from forward (the router
never calls a block's other methods): under FSDP2 a block's parameters exist unsharded only inside its
forward. `topk_attention` therefore needs the last dense-early block to accept `return_attention=True`
and return (x, attention received).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from dataclasses import replace

import torch
import torch.nn as nn
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from wxray.models.blocks import copy_generator
from wxray.models.selectors import RoutingContext, TokenSelector, gather_tokens, make_selector


def _checkpointed(block: nn.Module, x: Tensor, generator: torch.Generator | None, kwargs: dict) -> Tensor:
    """Run `block` under activation checkpointing with replayable randomness.

    torch.utils.checkpoint restores only the global RNGs before recomputing. With an explicit
    generator, the block instead draws from a private copy started at the generator's current state
    (forward and recompute make identical draws); afterwards the caller's generator is advanced to
    where the block left it, exactly as without checkpointing.
    """
    if generator is None:
        return checkpoint(block, x, use_reentrant=False, generator=None, **kwargs)
    start = generator.get_state()
    end: list[Tensor] = []

    def run(x_: Tensor, **kw: object) -> Tensor:
        private = copy_generator(generator)  # a torch.Generator or RowGenerators ...
        private.set_state(start)  # ... at `start`, for the forward and the recompute alike
        out = block(x_, generator=private, **kw)
        end.append(private.get_state())
        return out

    out = checkpoint(run, x, use_reentrant=False, **kwargs)
    generator.set_state(end[0])
    return out


def _takes(block: nn.Module, kwarg: str) -> bool:
    # by name: a block that merely swallows **kwargs would not return the attention it was asked for
    return kwarg in inspect.signature(block.forward).parameters


class SparseRouter(nn.Module):
    """Runs `blocks` split (n1, n2, n3); the n2 middle blocks see only K = floor(r * L) tokens.

    keep_ratio == 1 (or n2 == 0) is exactly the plain dense loop: no selection, gather or scatter.
    `last_indices` holds the (B, K) selection of the latest sparse forward (None after a dense one).
    """

    def __init__(
        self,
        blocks: Sequence[nn.Module],
        split: Sequence[int],
        keep_ratio: float = 1.0,
        selection: str | TokenSelector = "random",
        deterministic: bool = False,
        dim: int | None = None,
    ):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        split = tuple(int(n) for n in split)
        if len(split) != 3 or any(n < 0 for n in split) or sum(split) != len(self.blocks):
            raise ValueError(
                f"split {split} must be three non-negative block counts summing to the number of blocks "
                f"({len(self.blocks)})"
            )
        if not 0.0 < keep_ratio <= 1.0:
            raise ValueError(f"keep_ratio must be in (0, 1], got {keep_ratio}")
        self.split = split
        self.keep_ratio = float(keep_ratio)
        if isinstance(selection, str):
            selection = make_selector(selection, dim=dim, deterministic=deterministic)
        self.selector = selection
        n1 = split[0]
        if self.selector.needs_attention and not (n1 > 0 and _takes(self.blocks[n1 - 1], "return_attention")):
            raise ValueError(
                "topk_attention selection needs a dense-early block (split[0] >= 1) whose forward takes "
                "return_attention=True"
            )
        if self.selector.needs_first_block and n1 == 0:
            raise ValueError("activation_norm selection scores the first dense-early block: needs split[0] >= 1")
        self.activation_checkpointing = False
        self.last_indices: Tensor | None = None

    @property
    def sparse(self) -> bool:
        return self.keep_ratio < 1.0 and self.split[1] > 0

    def num_selected(self, num_tokens: int) -> int:
        return math.floor(self.keep_ratio * num_tokens)

    def _block(self, block: nn.Module, x: Tensor, generator: torch.Generator | None, kwargs: dict) -> Tensor:
        if self.activation_checkpointing and torch.is_grad_enabled():
            return _checkpointed(block, x, generator, kwargs)
        return block(x, generator=generator, **kwargs)

    def forward(
        self,
        x: Tensor,
        generator: torch.Generator | None = None,
        context: RoutingContext | None = None,
        token_kwargs: Sequence[str] = (),
        routing_generator: torch.Generator | None = None,
        **block_kwargs: object,
    ) -> Tensor:
        """x (B, L, D) -> (B, L, D).

        `token_kwargs` names entries of `block_kwargs` that are per-token tensors (B, L, ...); the
        middle blocks receive them gathered at the selected tokens. All other kwargs pass unchanged.
        `routing_generator`, if given, drives the token selection alone, so nested ensembles can vary
        routing draws while holding dropout draws (from `generator`) fixed, and vice versa.
        """
        n1, n2, _ = self.split
        self.selector.reset()
        if not self.sparse:
            self.last_indices = None
            for block in self.blocks:
                x = self._block(block, x, generator, block_kwargs)
            return x

        context = context or RoutingContext()
        for i, block in enumerate(self.blocks[:n1]):
            if i == n1 - 1 and self.selector.needs_attention:
                x, received = self._block(block, x, generator, {**block_kwargs, "return_attention": True})
                context = replace(context, attention=received)
            else:
                x = self._block(block, x, generator, block_kwargs)
            if i == 0 and self.selector.needs_first_block:
                context = replace(context, first_block=x)

        k = self.num_selected(x.shape[1])
        if k < 1:
            raise ValueError(f"keep_ratio {self.keep_ratio} selects no tokens out of {x.shape[1]}")
        selection_generator = routing_generator if routing_generator is not None else generator
        indices = self.selector.select(x, k, selection_generator, context)
        self.last_indices = indices.detach()
        x = self.sparse_stage(x, indices, generator, context, token_kwargs, block_kwargs)

        for block in self.blocks[n1 + n2 :]:
            x = self._block(block, x, generator, block_kwargs)
        return x

    def run_middle(
        self,
        x0: Tensor,
        indices: Tensor,
        generator: torch.Generator | None = None,
        token_kwargs: Sequence[str] = (),
        block_kwargs: dict | None = None,
    ) -> tuple[Tensor, Tensor]:
        """(h0, h): the gathered tokens and what the middle blocks make of them; per-token kwargs gathered too."""
        middle_kwargs = {
            name: gather_tokens(v, indices) if name in token_kwargs else v for name, v in (block_kwargs or {}).items()
        }
        n1, n2, _ = self.split
        h0 = gather_tokens(x0, indices)
        h = h0
        for block in self.blocks[n1 : n1 + n2]:
            h = self._block(block, h, generator, middle_kwargs)
        return h0, h

    def sparse_stage(
        self,
        x0: Tensor,
        indices: Tensor,
        generator: torch.Generator | None = None,
        context: RoutingContext | None = None,
        token_kwargs: Sequence[str] = (),
        block_kwargs: dict | None = None,
    ) -> Tensor:
        """Middle blocks on the tokens at `indices` (B, K); Eq. 8-9. Public so tests can probe it."""
        h0, h = self.run_middle(x0, indices, generator, token_kwargs, block_kwargs)
        delta = h - h0
        gate = self.selector.delta_gate(x0, indices, context)
        if gate is not None:
            delta = delta * gate
        return x0.scatter_add(1, indices.unsqueeze(-1).expand_as(delta), delta)
