"""Training losses: latitude-weighted MSE (Eq. 3), the fair ensemble CRPS (and its loss), the learned selector's BCE."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from wxray.models.selectors import LearnedSelector


def latitude_weights(lat_deg: Tensor) -> Tensor:
    """cos(latitude) normalised to mean 1, same shape as `lat_deg` (degrees)."""
    w = torch.cos(torch.deg2rad(lat_deg))
    return w / w.mean()


def _check(pred: Tensor, target: Tensor, lat_weights: Tensor) -> Tensor:
    if pred.shape != target.shape or pred.ndim != 4:
        raise ValueError(
            f"pred and target must both be (B, V, h, w); got {tuple(pred.shape)}, {tuple(target.shape)}"
        )
    if lat_weights.shape != (pred.shape[2],):
        raise ValueError(f"lat_weights must have shape ({pred.shape[2]},), got {tuple(lat_weights.shape)}")
    return lat_weights.to(pred.dtype)[:, None]  # (h, 1): constant along longitude


def _lat_mean_per_var(score: Tensor, w: Tensor) -> Tensor:
    """(V,): latitude-weighted grid mean of a (B, V, h, w) score, w (h, 1), averaged over the batch."""
    return (score * w).sum(dim=(-2, -1)).mean(dim=0) / (w.sum() * score.shape[-1])


def _var_weighted_mean(per_var: Tensor, var_weights: Tensor | None) -> Tensor:
    if var_weights is not None:
        if var_weights.shape != per_var.shape:
            raise ValueError(f"var_weights must be ({per_var.shape[0]},), got {tuple(var_weights.shape)}")
        per_var = per_var * var_weights.to(per_var.dtype)
    return per_var.mean()


def lat_weighted_mse_per_var(pred: Tensor, target: Tensor, lat_weights: Tensor) -> Tensor:
    """(V,): sum_i cos(phi_i) (pred - target)^2 / sum_i cos(phi_i), averaged over the batch. For logging."""
    w = _check(pred, target, lat_weights)
    return _lat_mean_per_var((pred - target).square(), w)


def lat_weighted_mse(
    pred: Tensor, target: Tensor, lat_weights: Tensor, var_weights: Tensor | None = None
) -> Tensor:
    """Eq. 3: (1 / |V|) sum_v w_v * latitude-weighted MSE of variable v; scalar.

    Normalising by the weight sum (not assuming mean-1 weights) keeps Eq. 3 exact for any positive weights.
    """
    return _var_weighted_mean(lat_weighted_mse_per_var(pred, target, lat_weights), var_weights)


def fair_crps(ens: Tensor, obs: Tensor, member_dim: int, alpha: float = 1.0) -> Tensor:
    """Fair (unbiased) ensemble CRPS per point; differentiable in `ens`. `alpha` < 1: "almost fair".

        CRPS_fair = mean_i |x_i - y| - sum_ij |x_i - x_j| / (2 M (M - 1))

    `obs` has the shape of `ens` without `member_dim`. The pair sum uses the sorted-members identity
    sum_ij |x_i - x_j| = 2 sum_k (2k - M - 1) x_(k) (k = 1..M ascending): O(M log M) time and no
    (M, M, ...) tensor, so members can be a batch dimension of a full grid.

    alpha blends the fair (alpha = 1) and the standard ecdf CRPS (alpha = 0, pair sum / (2 M^2)) as
    anemoi-core's AlmostFairKernelCRPS does, with eps = (1 - alpha) / M:

        CRPS_alpha = mean_i |x_i - y| - (1 - eps) sum_ij |x_i - x_j| / (2 M (M - 1))
                   = alpha CRPS_fair + (1 - alpha) CRPS_ecdf
    """
    member_dim = member_dim % ens.ndim
    M = ens.shape[member_dim]
    if M < 2:
        raise ValueError(f"fair CRPS needs at least 2 ensemble members, got {M}")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1] (1 = fair, 0 = standard CRPS), got {alpha}")
    expected = ens.shape[:member_dim] + ens.shape[member_dim + 1 :]
    if obs.shape != expected:
        raise ValueError(
            f"obs must have shape {tuple(expected)} (ens without member_dim), got {tuple(obs.shape)}"
        )
    skill = (ens - obs.unsqueeze(member_dim)).abs().mean(dim=member_dim)
    ranked = ens.sort(dim=member_dim).values
    coef = torch.arange(1, M + 1, device=ens.device, dtype=ens.dtype) * 2 - M - 1
    coef = coef.view([M if d == member_dim else 1 for d in range(ens.ndim)])
    pair_sum = 2 * (coef * ranked).sum(dim=member_dim)
    spread = pair_sum / (2 * M * (M - 1))
    return skill - spread if alpha == 1.0 else skill - (1 - (1 - alpha) / M) * spread


def fair_crps_loss(
    ens: Tensor,
    target: Tensor,
    member_dim: int,
    lat_weights: Tensor,
    var_weights: Tensor | None = None,
    alpha: float = 1.0,
) -> Tensor:
    """Training loss: (1 / |V|) sum_v w_v * latitude-weighted grid mean of CRPS_alpha (fair_crps), batch mean.

    target (B, V, h, w); ens the same with a member dim inserted at `member_dim` (members of one sample
    together: a (b*M, V, h, w) output of the stochastic models is `split_members(y, M)`, member_dim=1).
    Weighting as in lat_weighted_mse: sum_i cos(phi_i) CRPS_i / sum_i cos(phi_i) per variable. Scalar; every
    sample's CRPS is over its own M members, so the members of a sample must not be split across ranks.
    """
    if ens.ndim != 5 or target.ndim != 4:
        raise ValueError(
            f"need ens (B, V, h, w) with a member dim and target (B, V, h, w); got {tuple(ens.shape)}, "
            f"{tuple(target.shape)}"
        )
    crps = fair_crps(ens, target, member_dim, alpha)
    w = _check(crps, target, lat_weights)
    return _var_weighted_mean(_lat_mean_per_var(crps, w), var_weights)


def per_patch_error(pred: Tensor, target: Tensor, lat_weights: Tensor, num_tokens: int) -> Tensor:
    """(B, L): mean over channels and the patch's pixels of cos(phi) (pred - target)^2, row-major tokens.

    The patch size is recovered from the shapes (L p^2 = h w), so any model on this grid can be scored.
    """
    w = _check(pred, target, lat_weights)
    h, wd = pred.shape[-2:]
    p = math.isqrt(h * wd // max(num_tokens, 1))
    if p < 1 or p * p * num_tokens != h * wd or h % p or wd % p:
        raise ValueError(f"{num_tokens} tokens do not tile a {h}x{wd} grid with square patches")
    err = ((pred - target).square() * w).mean(dim=1, keepdim=True)  # (B, 1, h, w)
    return F.avg_pool2d(err, p).flatten(1)


def selector_loss(model: nn.Module, pred: Tensor, target: Tensor, lat_weights: Tensor) -> Tensor | None:
    """BCE training signal of the `learned` selection's difficulty head; None if the model has none.

        e_bi = per_patch_error(pred, target)_bi                  (detached)
        t_bi = rank of e_bi among sample b's L patches / (L - 1)  in [0, 1], 1 = worst patch
        loss = mean_bi BCE(sigmoid(z_bi), t_bi),  z = the head's logits from the forward that made `pred`

    Soft rank targets rather than hard top-K labels: the BCE minimiser is sigmoid(z) = t, so the head
    learns the whole error ordering, not just which side of the K-th error each patch falls on, and the
    target does not depend on the keep ratio. Its minimum is the targets' mean entropy (about 0.5), not 0.

    Reads only the logits the selector kept during forward (the head's input there is detached), so the
    gradient reaches the head alone and no module is called here, which FSDP2 requires. `model` may be
    wrapped (DDP, torch.compile): `modules()` reaches the selector through any wrapper.
    """
    heads = [m for m in model.modules() if isinstance(m, LearnedSelector) and m.last_logits is not None]
    if not heads:
        return None
    if len(heads) > 1:
        raise ValueError(f"selector_loss found {len(heads)} learned selectors with logits; expected one")
    logits = heads[0].last_logits.float()
    B, L = logits.shape
    if pred.shape[0] != B:
        raise ValueError(f"pred has batch {pred.shape[0]} but the selector's logits have {B}")
    with torch.no_grad():
        err = per_patch_error(pred.detach().float(), target.float(), lat_weights, L)
        ranks = err.argsort(dim=1).argsort(dim=1).to(logits.dtype)
    return F.binary_cross_entropy_with_logits(logits, ranks / max(L - 1, 1))
