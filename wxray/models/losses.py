"""Training losses: latitude-weighted MSE (Eq. 3) and the fair ensemble CRPS."""

from __future__ import annotations

import torch
from torch import Tensor


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


def lat_weighted_mse_per_var(pred: Tensor, target: Tensor, lat_weights: Tensor) -> Tensor:
    """(V,): sum_i cos(phi_i) (pred - target)^2 / sum_i cos(phi_i), averaged over the batch. For logging."""
    w = _check(pred, target, lat_weights)
    err = (pred - target).square() * w
    return err.sum(dim=(-2, -1)).mean(dim=0) / (w.sum() * pred.shape[-1])


def lat_weighted_mse(
    pred: Tensor, target: Tensor, lat_weights: Tensor, var_weights: Tensor | None = None
) -> Tensor:
    """Eq. 3: (1 / |V|) sum_v w_v * latitude-weighted MSE of variable v; scalar.

    Normalising by the weight sum (not assuming mean-1 weights) keeps Eq. 3 exact for any positive weights.
    """
    per_var = lat_weighted_mse_per_var(pred, target, lat_weights)
    if var_weights is not None:
        if var_weights.shape != per_var.shape:
            raise ValueError(f"var_weights must be ({per_var.shape[0]},), got {tuple(var_weights.shape)}")
        per_var = per_var * var_weights.to(per_var.dtype)
    return per_var.mean()


def fair_crps(ens: Tensor, obs: Tensor, member_dim: int) -> Tensor:
    """Fair (unbiased) ensemble CRPS per point; differentiable in `ens`.

        CRPS_fair = mean_i |x_i - y| - sum_ij |x_i - x_j| / (2 M (M - 1))

    `obs` has the shape of `ens` without `member_dim`. The pair sum uses the sorted-members identity
    sum_ij |x_i - x_j| = 2 sum_k (2k - M - 1) x_(k) (k = 1..M ascending): O(M log M) time and no
    (M, M, ...) tensor, so members can be a batch dimension of a full grid.
    """
    member_dim = member_dim % ens.ndim
    M = ens.shape[member_dim]
    if M < 2:
        raise ValueError(f"fair CRPS needs at least 2 ensemble members, got {M}")
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
    return skill - pair_sum / (2 * M * (M - 1))
