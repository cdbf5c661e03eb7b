"""Token-selection strategies for SparseRouter.

Interface (every selector is an nn.Module so `model.eval()` reaches it and learned ones own parameters):

    select(x, k, generator=None, context=None) -> LongTensor (B, K): distinct indices, sorted ascending
    delta_gate(x, indices, context=None) -> Tensor (B, K, 1) | None: multiplier on the routed delta
    reset(): forget per-forward state (the router calls it at the start of every forward)

`x` is the token sequence after the dense-early stage. `random` is the paper's default (Sec. 3.2); the
others are the ablations of Sec. 4.4 / appendix B.2 and keep the K highest-scoring tokens:

    topk_attention   attention each token receives in the LAST dense-early block (Table 5)
    activation_norm  ||token||_2 at the output of the FIRST dense-early block (Table 13)
    laplacian        mean |5-point Laplacian| of the standardised dynamic input fields per patch (Table 13)
    gradient         mean |forward-difference gradient| of the same fields per patch (our extra ablation)
    learned          MLP difficulty head, fitted by BCE to the error ranks of the prediction (Table 5)
    learned_st       the same head, trained instead by a straight-through gate on the routed delta

Scores are computed without gradient: top-k is not differentiable. The learned head alone needs a
training signal; it comes from `losses.selector_loss` (or from `delta_gate` for `learned_st`).
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
    n_dynamic: int | None = None  # fields[:, :n_dynamic] vary in time, the rest are constants; None = all
    periodic: bool = True  # the fields' first and last columns are neighbours (a global grid)
    attention: Tensor | None = None  # (B, L) attention received; filled in by the router
    first_block: Tensor | None = None  # (B, L, D) output of dense-early block 0; filled in by the router


def gather_tokens(x: Tensor, indices: Tensor) -> Tensor:
    """x (B, L, ...) at indices (B, K) -> (B, K, ...)."""
    idx = indices.view(*indices.shape, *([1] * (x.ndim - 2))).expand(-1, -1, *x.shape[2:])
    return x.gather(1, idx)


def topk_sorted(scores: Tensor, k: int) -> Tensor:
    return scores.topk(k, dim=1).indices.sort(dim=1).values


class TokenSelector(nn.Module):
    """Base: keeps the K highest `score(x, context)` tokens; subclasses define `score` or `select`."""

    needs_attention = False  # the router has the last dense-early block return its attention received
    needs_first_block = False  # the router records the output of dense-early block 0

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

    def reset(self) -> None:
        pass


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
    """Top-K by ||h_i||_2, h the output of the first dense-early block (appendix B.2, Table 13).

    Block 0, not the end of the dense-early stage, because that is what the paper evaluated.
    """

    needs_first_block = True

    def score(self, x: Tensor, context: RoutingContext | None) -> Tensor:
        if context is None or context.first_block is None:
            raise ValueError("activation_norm selection needs context.first_block from the router")
        return context.first_block.norm(dim=-1)


class FieldSelector(TokenSelector):
    """Top-K by the patch mean of a per-pixel roughness density of the input fields.

    Only the dynamic fields count (constants such as orography would pin the selection to coastlines
    and mountains forever). Each field is standardised per sample, so variables with large units
    (geopotential) do not decide the ranking alone, and the density is averaged over fields.
    """

    name = "field"  # subclasses define density(f, periodic) -> (B, C, h, w) non-negative roughness

    def score(self, x: Tensor, context: RoutingContext | None) -> Tensor:
        if context is None or context.fields is None or context.grid is None:
            raise ValueError(f"{self.name} selection needs context.fields and context.grid from the model")
        f = context.fields[:, : context.n_dynamic].float()
        if f.shape[1] == 0:
            raise ValueError(f"{self.name} selection needs at least one dynamic input field")
        # a spatially constant field standardises to 0, not to 0/0
        f = (f - f.mean(dim=(-2, -1), keepdim=True)) / (f.std(dim=(-2, -1), keepdim=True) + 1e-6)
        per_pixel = self.density(f, context.periodic).mean(dim=1, keepdim=True)  # (B, 1, h, w)
        scores = F.adaptive_avg_pool2d(per_pixel, context.grid).flatten(1)  # p divides h, w: exact means
        if scores.shape[1] != x.shape[1]:
            raise ValueError(f"context.grid {context.grid} has {scores.shape[1]} tokens, x has {x.shape[1]}")
        return scores


class LaplacianSelector(FieldSelector):
    """Top-K by the patch mean of |∇²f| (appendix B.2, 'gradient-based sampler using a Laplacian score').

        ∇²f[i, j] = f[i, j+1] + f[i, j-1] - 2 f[i, j]  +  f[i+1, j] + f[i-1, j] - 2 f[i, j]   (5-point)

    Longitude is periodic on a global grid (column -1 neighbours column 0), so rolling the fields by whole
    patches along longitude rolls the scores the same way; on a regional grid (`context.periodic` false)
    the edge columns take their neighbour's second difference. Latitude is never periodic: on the first
    and last rows the latitude
    term is the one-sided second difference f[0] - 2 f[1] + f[2] (the neighbouring row's), so a field
    that varies linearly with latitude scores 0 everywhere. Replicate padding would put the first
    difference f[1] - f[0] there instead and bias the selection towards the polar rows.
    """

    name = "laplacian"

    def density(self, f: Tensor, periodic: bool = True) -> Tensor:
        if periodic:
            d2x = f.roll(1, dims=-1) + f.roll(-1, dims=-1) - 2 * f
        elif f.shape[-1] >= 3:
            d2x = F.pad(f.diff(n=2, dim=-1), (1, 1, 0, 0), mode="replicate")
        else:
            d2x = torch.zeros_like(f)
        if f.shape[-2] < 3:  # no second difference along one or two rows
            return d2x.abs()
        d2y = F.pad(f.diff(n=2, dim=-2), (0, 0, 1, 1), mode="replicate")
        return (d2x + d2y).abs()


class GradientSelector(FieldSelector):
    """Top-K by the patch mean of |∇f| = sqrt(dx² + dy²) from forward differences.

    Not in the paper; the first-derivative counterpart of `laplacian`, kept as an ablation. dx wraps in
    longitude; the last latitude row has no row beyond it and reuses the backward difference.
    """

    name = "gradient"

    def density(self, f: Tensor, periodic: bool = True) -> Tensor:
        if periodic:
            dx = f.roll(-1, dims=-1) - f
        else:  # regional: the east edge reuses the backward difference, as the last row does
            dx = F.pad(f.diff(dim=-1), (0, 1, 0, 0), mode="replicate") if f.shape[-1] > 1 else torch.zeros_like(f)
        dy = F.pad(f.diff(dim=-2), (0, 0, 0, 1), mode="replicate") if f.shape[-2] > 1 else torch.zeros_like(f)
        return (dx.square() + dy.square()).sqrt()


class LearnedSelector(TokenSelector):
    """Top-K by a small MLP difficulty head z_i = head(x_i) (Table 5, 'learned').

    Default training signal (error ranks): `select` computes the logits z (B, L) inside the model's
    forward, on the detached tokens, and keeps them with their graph in `last_logits`;
    `losses.selector_loss` then fits sigmoid(z_i) by BCE to the rank of patch i's error in the current
    prediction. The head learns to predict where the model is wrong, and the backbone is not shaped by
    this auxiliary task. Nothing is called outside forward, so FSDP2 sharding is respected.

    `straight_through=True` (selection `learned_st`): no auxiliary loss; the routed delta is multiplied
    by g = 1 + s - stop_grad(s), s = sigmoid(head(token)). Its forward value is exactly 1, while the
    head receives d loss / d s = <d loss / d x', delta>: scores rise for tokens whose middle-stage update
    lowers the loss. Unselected tokens get no signal, as in top-k expert routing.
    """

    def __init__(self, dim: int, hidden: int | None = None, straight_through: bool = False):
        super().__init__()
        hidden = hidden or max(dim // 4, 8)
        self.head = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, 1))
        self.straight_through = straight_through
        self.last_logits: Tensor | None = None  # (B, L), set by the latest sparse forward (ranks mode)

    def score(self, x: Tensor, context: RoutingContext | None) -> Tensor:
        return self.head(x).squeeze(-1)

    def select(
        self,
        x: Tensor,
        k: int,
        generator: torch.Generator | None = None,
        context: RoutingContext | None = None,
    ) -> Tensor:
        if self.straight_through:
            return super().select(x, k, generator, context)
        logits = self.score(x.detach(), context)
        self.last_logits = logits
        return topk_sorted(logits.detach(), k)

    def delta_gate(self, x: Tensor, indices: Tensor, context: RoutingContext | None = None) -> Tensor | None:
        if not self.straight_through:
            return None
        s = torch.sigmoid(self.head(gather_tokens(x, indices)))  # (B, K, 1)
        return (s - s.detach()) + 1.0  # evaluated left to right: exactly 0 + 1 in the forward

    def reset(self) -> None:
        # a dense forward (keep_ratio 1) must not leave the previous step's logits for selector_loss
        self.last_logits = None


SELECTIONS = ("random", "topk_attention", "learned", "learned_st", "laplacian", "gradient", "activation_norm")


def make_selector(name: str, dim: int | None = None, deterministic: bool = False) -> TokenSelector:
    """Selector by config name; `dim` is needed by `learned`/`learned_st`, `deterministic` by `random`."""
    if name == "random":
        return RandomSelector(deterministic=deterministic)
    if name == "topk_attention":
        return AttentionSelector()
    if name == "activation_norm":
        return ActivationNormSelector()
    if name == "laplacian":
        return LaplacianSelector()
    if name == "gradient":
        return GradientSelector()
    if name in ("learned", "learned_st"):
        if dim is None:
            raise ValueError(f"{name} selection needs the token dimension (dim)")
        return LearnedSelector(dim, straight_through=name == "learned_st")
    raise ValueError(f"unknown selection {name!r}; expected one of {', '.join(SELECTIONS)}")
