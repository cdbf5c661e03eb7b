"""Ensemble scores over named member dims, and the spread-skill of the nested ANOVA split.

Member dims are always named (`member`, or the nested `encoder_draw` x `dropout_draw` of the
stochastic-encoder ensemble). A metric that needs a single member dim flattens nested dims only when
it is given a tuple of dims: nothing is flattened behind the caller's back, because the ANOVA split
needs the nesting that a silent flatten would destroy. The split itself (`nested_anova`, with the
nested dim names) lives in `wxray.verify.anova` and is re-exported here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import xarray as xr

from wxray.data.schema import LAT, LON, MEMBER
from wxray.errors import DataError
from wxray.verify.anova import DROPOUT_DRAW, ENCODER_DRAW, ROUTING_DRAW, nested_anova
from wxray.verify.deterministic import RegionLike, mse
from wxray.verify.spatial import latitude_weights, region_mask, spatial_mean

MEMBER_DIMS = (MEMBER, ENCODER_DRAW, DROPOUT_DRAW, ROUTING_DRAW)

MemberDims = str | Sequence[str]


def member_dims_of(da: xr.DataArray | xr.Dataset) -> tuple[str, ...]:
    """The ensemble dims present, in the canonical order."""
    return tuple(d for d in MEMBER_DIMS if d in da.dims)


def flatten_members(da: xr.DataArray, dims: Sequence[str] = (ENCODER_DRAW, DROPOUT_DRAW),
                    new_dim: str = MEMBER) -> xr.DataArray:
    """Stack nested member dims into one dim `new_dim` numbered 0..K-1 (encoder draw outermost)."""
    dims = tuple(dims)
    missing = [d for d in dims if d not in da.dims]
    if missing:
        raise DataError(f"{da.name or 'forecast'}: no member dim(s) {missing} to flatten (dims: {da.dims})")
    if len(dims) == 1:
        return da if dims[0] == new_dim else da.rename({dims[0]: new_dim})
    if new_dim in da.dims:
        raise DataError(f"{da.name or 'forecast'}: cannot flatten {dims} into '{new_dim}', which exists")
    out = da.stack({new_dim: dims}, create_index=False)
    out = out.drop_vars([d for d in dims if d in out.coords])
    return out.assign_coords({new_dim: np.arange(out.sizes[new_dim])})


def _member_dim(da: xr.DataArray, member_dim: MemberDims) -> tuple[xr.DataArray, str]:
    if isinstance(member_dim, str):
        if member_dim not in da.dims:
            raise DataError(f"{da.name or 'forecast'}: no member dim '{member_dim}' (dims: {da.dims})")
        return da, member_dim
    dims = tuple(member_dim)
    if len(dims) == 1:
        return _member_dim(da, dims[0])
    return flatten_members(da, dims), MEMBER


def ensemble_size(da: xr.DataArray, member_dim: MemberDims = MEMBER) -> int:
    dims = (member_dim,) if isinstance(member_dim, str) else tuple(member_dim)
    return int(np.prod([da.sizes[d] for d in dims]))


def _require_members(da: xr.DataArray, dim: str, what: str) -> int:
    k = da.sizes[dim]
    if k < 2:
        raise DataError(f"{da.name or 'forecast'}: {what} needs at least 2 members, '{dim}' has {k}")
    return k


def _paired(forecast: xr.DataArray, truth: xr.DataArray, dim: str | tuple[str, ...],
            skipna: bool) -> tuple[xr.DataArray, xr.DataArray]:
    # A point counts only where the truth and every member are present, so that a missing member does
    # not silently turn a K-member CRPS into a (K-1)-member one at some points.
    if not skipna:
        return forecast, truth
    valid = forecast.notnull().all(dim) & truth.notnull()
    return forecast.where(valid), truth.where(valid)


def sort_members(x: xr.DataArray, dim: str) -> xr.DataArray:
    """The members in ascending order along `dim`, moved last (NaN sorts last)."""
    return xr.apply_ufunc(np.sort, x, input_core_dims=[[dim]], output_core_dims=[[dim]], kwargs={"axis": -1})


def _pairwise_abs_sum(x: xr.DataArray, dim: str, presorted: bool = False) -> xr.DataArray:
    """sum_ij |x_i - x_j| in O(K log K): with x sorted, it is 2 sum_i (2i - K - 1) x_(i), i = 1..K.
    `presorted`: x is already `sort_members(x, dim)` (the sort the rank histogram reads too)."""
    k = x.sizes[dim]
    xs = x if presorted else sort_members(x, dim)
    coeff = xr.DataArray(2.0 * np.arange(1, k + 1) - k - 1, dims=[dim])
    return 2 * (xs * coeff).sum(dim, skipna=False)


@dataclass(frozen=True)
class CRPSTerms:
    """The terms every CRPS of K members is built from, the members sorted once: `error` = mean_k |x_k - y| and
    `pairs` = sum_kl |x_k - x_l|; for a nested ensemble of M encoder groups also `within`, the pairs inside a
    group (`crps_field_nested` says why they are left out of its fair form).

        fair   error - pairs / (2 K (K-1))                      exchangeable members (Ferro 2014)
               error - (pairs - within) / (2 M (M-1) (K/M)^2)   a nested ensemble
        ecdf   error - pairs / (2 K^2)                          the members' empirical distribution
    """

    error: xr.DataArray
    pairs: xr.DataArray
    k: int
    groups: int = 0  # M of a nested ensemble; 0: exchangeable members
    within: xr.DataArray | None = None
    # all K members sorted (member dim last), paired with the truth: `pairs` came from it, `rank_counts` reads it
    sorted: xr.DataArray | None = None

    def fair(self) -> xr.DataArray:
        if self.within is None:
            return (self.error - self.pairs / (2.0 * self.k * (self.k - 1))).rename("crps")
        m, n = self.groups, self.k // self.groups
        return (self.error - (self.pairs - self.within) / (2.0 * m * (m - 1) * n * n)).rename("crps")

    def ecdf(self) -> xr.DataArray:
        return (self.error - self.pairs / (2.0 * self.k * self.k)).rename("crps")


def crps_terms(forecast: xr.DataArray, truth: xr.DataArray, member_dim: MemberDims = MEMBER,
               skipna: bool = False) -> CRPSTerms:
    """The CRPS terms of exchangeable members (nested dims in a tuple are flattened)."""
    forecast, dim = _member_dim(forecast, member_dim)
    f, t = _paired(forecast, truth, dim, skipna)
    xs = sort_members(f, dim)
    return CRPSTerms(abs(f - t).mean(dim, skipna=False), _pairwise_abs_sum(xs, dim, presorted=True),
                     forecast.sizes[dim], sorted=xs)


def crps_field(forecast: xr.DataArray, truth: xr.DataArray, member_dim: MemberDims = MEMBER,
               fair: bool = True, skipna: bool = False) -> xr.DataArray:
    """Pointwise ensemble CRPS: mean_i |x_i - y| - sum_ij |x_i - x_j| / (2 K(K-1)) (fair) or / (2 K^2) (ECDF).

    The fair form is the unbiased estimate of the CRPS of the distribution the members are drawn from
    (Ferro 2014), so it does not reward a small ensemble for being under-dispersed.
    """
    forecast, dim = _member_dim(forecast, member_dim)
    if fair:
        _require_members(forecast, dim, "fair CRPS")
    terms = crps_terms(forecast, truth, dim, skipna)
    return terms.fair() if fair else terms.ecdf()


def crps_fair(forecast: xr.DataArray, truth: xr.DataArray, member_dim: MemberDims = MEMBER,
              region: RegionLike = None, skipna: bool = False) -> xr.DataArray:
    return spatial_mean(crps_field(forecast, truth, member_dim, True, skipna), region, skipna).rename("crps")


def crps_ecdf(forecast: xr.DataArray, truth: xr.DataArray, member_dim: MemberDims = MEMBER,
              region: RegionLike = None, skipna: bool = False) -> xr.DataArray:
    field = crps_field(forecast, truth, member_dim, False, skipna)
    return spatial_mean(field, region, skipna).rename("crps_ecdf")


def crps(forecast: xr.DataArray, truth: xr.DataArray, member_dim: MemberDims | None = None,
         region: RegionLike = None, skipna: bool = False) -> xr.DataArray:
    """The proper score of any forecast: fair CRPS of an ensemble, absolute error of a deterministic one.

    A deterministic forecast is a one-member ensemble whose CRPS is its absolute error, so this score
    compares deterministic and probabilistic forecasts on the same footing.
    """
    if member_dim is None or ensemble_size(forecast, member_dim) == 1:
        if member_dim is not None:
            forecast = forecast.squeeze((member_dim,) if isinstance(member_dim, str) else tuple(member_dim))
        err = abs(forecast - truth)
        if skipna:
            err = err.where(forecast.notnull() & truth.notnull())
        return spatial_mean(err, region, skipna).rename("crps")
    return crps_fair(forecast, truth, member_dim, region, skipna)


def ensemble_mean(forecast: xr.DataArray, member_dim: MemberDims = MEMBER,
                  skipna: bool = False) -> xr.DataArray:
    dims = [member_dim] if isinstance(member_dim, str) else list(member_dim)
    missing = [d for d in dims if d not in forecast.dims]
    if missing:
        raise DataError(f"{forecast.name or 'forecast'}: no member dim(s) {missing} (dims: {forecast.dims})")
    return forecast.mean(dims, skipna=skipna)


def ensemble_variance(forecast: xr.DataArray, member_dim: MemberDims = MEMBER) -> xr.DataArray:
    """Pointwise unbiased (ddof=1) variance across members."""
    forecast, dim = _member_dim(forecast, member_dim)
    _require_members(forecast, dim, "ensemble spread")
    return forecast.var(dim, ddof=1, skipna=False).rename("variance")


def _time_mean(da: xr.DataArray, time_dims: Sequence[str], skipna: bool) -> xr.DataArray:
    return da.mean(list(time_dims), skipna=skipna) if time_dims else da


def spread(forecast: xr.DataArray, member_dim: MemberDims = MEMBER, time_dims: Sequence[str] = (),
           region: RegionLike = None, skipna: bool = False) -> xr.DataArray:
    """sqrt of the mean ensemble variance (variance averaged over space and `time_dims` before the root)."""
    var = spatial_mean(ensemble_variance(forecast, member_dim), region, skipna)
    return np.sqrt(_time_mean(var, time_dims, skipna)).rename("spread")


def ensemble_mean_rmse(forecast: xr.DataArray, truth: xr.DataArray, member_dim: MemberDims = MEMBER,
                       time_dims: Sequence[str] = (), region: RegionLike = None,
                       skipna: bool = False) -> xr.DataArray:
    err = mse(ensemble_mean(forecast, member_dim, skipna), truth, region, skipna)
    return np.sqrt(_time_mean(err, time_dims, skipna)).rename("rmse")


def finite_size_factor(n_members: int) -> float:
    """sqrt((K+1)/K): a calibrated K-member ensemble's mean has error variance (1 + 1/K) sigma^2."""
    return float(np.sqrt((n_members + 1) / n_members))


def spread_skill_from_means(mean_variance, mean_mse, n_members: int):
    """Spread-skill ratio from already averaged variance and ensemble-mean MSE (arrays or scalars).

    Works on bootstrap resamples, which is why it takes means rather than fields.
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        return finite_size_factor(n_members) * np.sqrt(mean_variance / mean_mse)


def spread_skill_ratio(forecast: xr.DataArray, truth: xr.DataArray, member_dim: MemberDims = MEMBER,
                       time_dims: Sequence[str] = (), region: RegionLike = None,
                       skipna: bool = False) -> xr.DataArray:
    """sqrt((K+1)/K) * spread / ensemble-mean RMSE: 1 for a calibrated ensemble of any size K."""
    k = ensemble_size(forecast, member_dim)
    var = spatial_mean(ensemble_variance(forecast, member_dim), region, skipna)
    err = mse(ensemble_mean(forecast, member_dim, skipna), truth, region, skipna)
    var, err = _time_mean(var, time_dims, skipna), _time_mean(err, time_dims, skipna)
    return xr.DataArray(spread_skill_from_means(var, err, k)).rename("spread_skill_ratio")


def rank_histogram(forecast: xr.DataArray, truth: xr.DataArray, member_dim: MemberDims = MEMBER,
                   preserve_dims: Sequence[str] = (), region: RegionLike = None) -> xr.DataArray:
    """Latitude-weighted relative frequency of the truth's rank among the members (ties shared equally).

    Delegates to `scores.probability.rank_histogram`; the weights are those of `spatial_mean`.
    """
    from scores.probability import rank_histogram as _scores_rank_histogram

    forecast, dim = _member_dim(forecast, member_dim)
    _require_members(forecast, dim, "a rank histogram")
    weights = latitude_weights(forecast[LAT]) * xr.ones_like(forecast[LON], dtype=np.float64)
    mask = region_mask(region, forecast[LAT], forecast[LON])
    if mask is not None:
        weights = weights.where(mask, 0.0)
    keep = list(preserve_dims) if preserve_dims else None
    out = _scores_rank_histogram(forecast, truth, dim, preserve_dims=keep, weights=weights)
    return out.rename("rank_histogram")


def _count_below(xs: np.ndarray, y: np.ndarray, strict: bool) -> np.ndarray:
    """#{k: xs_k < y} (strict) or #{k: xs_k <= y} per point, xs sorted along its last axis: a binary search
    per point (log2 K gathers instead of K comparisons: what the sort buys the rank histogram)."""
    k = xs.shape[-1]
    lo, hi = np.zeros(y.shape, dtype=np.intp), np.full(y.shape, k, dtype=np.intp)
    while (open_ := lo < hi).any():
        mid = (lo + hi) // 2
        v = np.take_along_axis(xs, np.minimum(mid, k - 1)[..., None], axis=-1)[..., 0]
        right = open_ & ((v < y) if strict else (v <= y))
        lo = np.where(right, mid + 1, lo)
        hi = np.where(open_ & ~right, mid, hi)
    return lo


def rank_counts(sorted_members: xr.DataArray, truth: xr.DataArray, weights: xr.DataArray) -> np.ndarray:
    """Weighted counts of the truth's rank among K sorted members (member dim last), length K + 1: what
    `rank_histogram` normalises (counts / counts.sum()), so counts of blocks of inits or latitude bands add up.

    A point of weight w whose truth ties with members shares w equally among its ranks: with lo = #{x < y}
    and hi = #{x <= y} it adds w / (hi - lo + 1) to ranks lo+1 .. hi+1 (as `scores.probability`); a point
    with a missing member or truth counts nowhere.
    """
    dim = sorted_members.dims[-1]
    xs = sorted_members.transpose(*truth.dims, dim).values
    y = truth.values
    w = xr.broadcast(weights, truth)[0].transpose(*truth.dims).values
    k = xs.shape[-1]
    valid = np.isfinite(xs[..., -1]) & np.isfinite(y)  # NaN sorts last: one look per point
    lo, hi = _count_below(xs, y, True)[valid], _count_below(xs, y, False)[valid]
    share = w[valid] / (hi - lo + 1)
    starts = np.bincount(lo, weights=share, minlength=k + 2)
    ends = np.bincount(hi + 1, weights=share, minlength=k + 2)
    return np.cumsum(starts - ends)[: k + 1]


def nested_finite_factors(draws: Sequence[int]) -> list[float]:
    """1 + 1 / (independent draws at each level): a nested ensemble of M encoder draws x N dropout members
    (x R routing draws) has draws (M, M N[, M N R]). Its mean's error variance, if calibrated, is
    sum_c U_c (1 + 1/draws_c): only the M draws carry the encoder spread into the mean, not all K = M N."""
    return [1.0 + 1.0 / d for d in draws]


def branch_spread_skill(components: Sequence, mean_mse, draws: Sequence[int]) -> dict[str, object]:
    """Per-branch spread-skill ratios of a nested ensemble, sharing the ensemble-mean MSE as denominator.

    ssr_c = sqrt((1 + 1/draws_c) U_c / MSE) for the components U_c (U_enc, U_drop[, U_route]) and their
    independent draws (`nested_finite_factors`); ssr_total = sqrt(sum_c ssr_c^2), which is 1 for a
    calibrated nested ensemble of any M, N (with N = 1 the usual sqrt((K+1)/K) spread / RMSE).

    The components are aggregated unclipped (`verify.anova`), so ssr_total is built from unbiased means. A
    branch whose true share is 0 can have a slightly negative mean; its ssr_c, a root, is then shown as 0
    (the clip touches the displayed branch ratio only, never ssr_total or the components).
    """
    names = ("ssr_enc", "ssr_drop", "ssr_route")[: len(components)]
    with np.errstate(divide="ignore", invalid="ignore"):
        sq = [f * u / mean_mse for f, u in zip(nested_finite_factors(draws), components, strict=True)]
        return {**{n: np.sqrt(np.maximum(v, 0.0)) for n, v in zip(names, sq, strict=True)},
                "ssr_total": np.sqrt(sum(sq))}


def crps_field_nested(forecast: xr.DataArray, truth: xr.DataArray, group_dim: str = ENCODER_DRAW,
                      skipna: bool = False) -> xr.DataArray:
    """Fair CRPS of a nested ensemble: mean_k |x_k - y| - E|X - X'| / 2, where E|X - X'| is estimated from
    the M (M-1) (NR)^2 pairs of members in different groups of `group_dim` only.

    Members of one encoder draw share its analysis (at lead 0 they are one field), so pairs within a group
    are not two independent draws from the forecast distribution, and the pooled fair CRPS, which counts
    them, overstates the score of a nested ensemble. With one member per group this is the fair CRPS.
    """
    return nested_crps_terms(forecast, truth, group_dim, skipna).fair()


def nested_crps_terms(forecast: xr.DataArray, truth: xr.DataArray, group_dim: str = ENCODER_DRAW,
                      skipna: bool = False) -> CRPSTerms:
    """The CRPS terms of a nested ensemble, with the pairs within each group of `group_dim`."""
    m = _require_members(forecast, group_dim, "nested fair CRPS")
    replicates = [d for d in member_dims_of(forecast) if d != group_dim]
    inner = flatten_members(forecast, replicates, "replicate") if replicates else forecast.expand_dims("replicate")
    n = inner.sizes["replicate"]
    inner, truth = _paired(inner, truth, (group_dim, "replicate"), skipna)
    error = abs(inner - truth).mean((group_dim, "replicate"), skipna=False)
    within = _pairwise_abs_sum(inner, "replicate").sum(group_dim, skipna=False)
    xs = sort_members(flatten_members(inner, (group_dim, "replicate")), MEMBER)
    pairs = _pairwise_abs_sum(xs, MEMBER, presorted=True)
    return CRPSTerms(error, pairs, m * n, m, within, sorted=xs)


def nested_spread_skill(forecast: xr.DataArray, truth: xr.DataArray, group_dim: str = ENCODER_DRAW,
                        replicate_dim: str = DROPOUT_DRAW, time_dims: Sequence[str] = (),
                        region: RegionLike = None, skipna: bool = False) -> xr.Dataset:
    """ANOVA components (space- and time-averaged) with per-branch and total spread-skill ratios."""
    parts = nested_anova(forecast, group_dim, replicate_dim)
    m, n = forecast.sizes[group_dim], forecast.sizes[replicate_dim]
    u_enc = _time_mean(spatial_mean(parts["u_enc"], region, skipna), time_dims, skipna)
    u_drop = _time_mean(spatial_mean(parts["u_drop"], region, skipna), time_dims, skipna)
    err = mse(ensemble_mean(forecast, (group_dim, replicate_dim), skipna), truth, region, skipna)
    ratios = branch_spread_skill((u_enc, u_drop), _time_mean(err, time_dims, skipna), (m, m * n))
    return xr.Dataset({"u_enc": u_enc, "u_drop": u_drop, "rho_drop": u_drop / (u_enc + u_drop), **ratios})
