"""Token-selection strategies for SparseRouter.

Interface (every selector is an nn.Module so `model.eval()` reaches it and learned ones own parameters):

    select(x, k, generator=None, context=None) -> LongTensor (B, K): distinct indices, sorted ascending
    delta_gate(x, indices, context=None) -> Tensor (B, K, 1) | None: multiplier on the routed delta

`random` is the paper's default (Sec. 3.2). The others are the ablations of Sec. 4.4 / appendix B.2;
they score tokens and keep the top K. Scores are computed without gradient: top-k is not
differentiable, and only the `learned` head needs a training signal, which it gets via `delta_gate`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from wxray.models.blocks import uniform


@dataclass
class RoutingContext:
    """What a model can tell a selector besides the tokens themselves."""

    fields: Tensor | None = None  # (B, C, h, w) model input fields, for field-based scores
    grid: tuple[int, int] | None = None  # token grid (h // p, w // p), row-major token order
    attention: Tensor | None = None  # (B, L) attention received; filled in by the router


def gather_tokens(x: Tensor, indices: Tensor) -> Tensor:
    """x (B, L, ...) at indices (B, K) -> (B, K, ...)."""
    idx = indices.view(*indices.shape, *([1] * (x.ndim - 2))).expand(-1, -1, *x.shape[2:])
    return x.gather(1, idx)


def topk_sorted(scores: Tensor, k: int) -> Tensor:
    return scores.topk(k, dim=1).indices.sort(dim=1).values


class TokenSelector(nn.Module):
    """Base: keeps the K highest `score(x, context)` tokens; subclasses define `score` or `select`."""

    needs_attention = False  # the router computes attention received in the last dense-early block

    def select(
        self,
        x: Tensor,
        k: int,
        generator: torch.Generator | None = None,
        context: RoutingContext | None = None,
    ) -> Tensor:
        with torch.no_grad():
            return topk_sorted(self.score(x, context), k)

    def delta_gate(self, x: Tensor, indices: Tensor, context: RoutingContext | None = None) -> Tensor | None:
        return None


class RandomSelector(TokenSelector):
    """K tokens uniformly without replacement, independently per sample (Algorithm 1, line 10).

    With `deterministic=True` and the module in eval mode, the selection is one fixed seeded draw
    shared by all samples, so eval needs no generator and a sample's forecast does not depend on its
    position in the batch.
    """

    def __init__(self, deterministic: bool = False, seed: int = 0):
        super().__init__()
        self.deterministic = deterministic
        self.seed = seed

    def select(
        self,
        x: Tensor,
        k: int,
        generator: torch.Generator | None = None,
        context: RoutingContext | None = None,
    ) -> Tensor:
        B, L = x.shape[:2]
        if self.deterministic and not self.training:
            fixed = torch.Generator().manual_seed(self.seed)
            idx = torch.randperm(L, generator=fixed)[:k].sort().values
            return idx.to(x.device).unsqueeze(0).repeat(B, 1)
        # float64 keys make ties (and hence any dependence on the sort algorithm) vanishingly rare
        keys = uniform((B, L), generator, x.device, dtype=torch.float64)
        return keys.argsort(dim=1, stable=True)[:, :k].sort(dim=1).values


class AttentionSelector(TokenSelector):
    """Top-K by attention received in the last dense-early block (Table 5, 'attention score')."""

    needs_attention = True

    def score(self, x: Tensor, context: RoutingContext | None) -> Tensor:
        if context is None or context.attention is None:
            raise ValueError("topk_attention selection needs context.attention from the router")
        return context.attention


class ActivationNormSelector(TokenSelector):
    """Top-K by L2 norm of the token after the dense-early stage (appendix B.2)."""

    def score(self, x: Tensor, context: RoutingContext | None) -> Tensor:
        return x.norm(dim=-1)


class LaplacianSelector(TokenSelector):
    """Top-K by mean gradient magnitude of the input fields inside each patch (appendix B.2).

    Each field is standardised per sample first so that variables with large units (geopotential)
    do not decide the ranking alone.
    """

    def score(self, x: Tensor, context: RoutingContext | None) -> Tensor:
        if context is None or context.fields is None or context.grid is None:
            raise ValueError("laplacian selection needs context.fields and context.grid from the model")
        f = context.fields.to(x.dtype)
        f = (f - f.mean(dim=(-2, -1), keepdim=True)) / (f.std(dim=(-2, -1), keepdim=True) + 1e-6)
        dy = F.pad(f.diff(dim=-2), (0, 0, 0, 1))
        dx = F.pad(f.diff(dim=-1), (0, 1, 0, 0))
        grad = (dx.square() + dy.square()).sqrt().mean(dim=1, keepdim=True)  # (B, 1, h, w)
        per_patch = F.adaptive_avg_pool2d(grad, context.grid)  # patch size divides h, w: exact means
        scores = per_patch.flatten(1)
        if scores.shape[1] != x.shape[1]:
            raise ValueError(f"context.grid {context.grid} has {scores.shape[1]} tokens, x has {x.shape[1]}")
        return scores


class LearnedSelector(TokenSelector):
    """Top-K by a small MLP difficulty head (Table 5, 'learned').

    Training signal: the routed delta is multiplied by a straight-through gate g = 1 + s - stop_grad(s)
    with s = sigmoid(head(token)). Its forward value is exactly 1, so the model computes the same thing
    as with any other selector, while the head receives d loss / d s = <d loss / d x', delta>: scores
    rise for tokens whose middle-stage update lowers the loss. Unselected tokens get no signal, as in
    top-k expert routing.
    """

    def __init__(self, dim: int, hidden: int | None = None):
        super().__init__()
        hidden = hidden or max(dim // 4, 8)
        self.head = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, 1))

    def score(self, x: Tensor, context: RoutingContext | None) -> Tensor:
        return self.head(x).squeeze(-1)

    def delta_gate(self, x: Tensor, indices: Tensor, context: RoutingContext | None = None) -> Tensor:
        s = torch.sigmoid(self.head(gather_tokens(x, indices)))  # (B, K, 1)
        return (s - s.detach()) + 1.0  # evaluated left to right: exactly 0 + 1 in the forward


SELECTIONS = ("random", "topk_attention", "learned", "laplacian", "activation_norm")


def make_selector(name: str, dim: int | None = None, deterministic: bool = False) -> TokenSelector:
    """Selector by config name; `dim` is needed by `learned`, `deterministic` by `random`."""
    if name == "random":
        return RandomSelector(deterministic=deterministic)
    if name == "topk_attention":
        return AttentionSelector()
    if name == "activation_norm":
        return ActivationNormSelector()
    if name == "laplacian":
        return LaplacianSelector()
    if name == "learned":
        if dim is None:
            raise ValueError("learned selection needs the token dimension (dim)")
        return LearnedSelector(dim)
    raise ValueError(f"unknown selection {name!r}; expected one of {', '.join(SELECTIONS)}")
