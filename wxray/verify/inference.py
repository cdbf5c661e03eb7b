"""Statistics on per-initialisation score series: correlation length, block bootstrap, Diebold-Mariano.

Every series here has one value per initialisation (a score already averaged over space), time on the
last axis. Spatial correlation is absorbed by that mean; what is left is the serial correlation between
nearby initialisations, which all three procedures account for through one correlation length.
Leading axes are batch axes (e.g. independent Monte Carlo trials), so everything is vectorised.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

from wxray.errors import DataError

MIN_SERIES_LENGTH = 4


def lag1_autocorrelation(x: np.ndarray) -> np.ndarray:
    """r1 = sum_t (x_t - xbar)(x_{t+1} - xbar) / sum_t (x_t - xbar)^2 along the last axis (0 if constant)."""
    x = np.asarray(x, dtype=np.float64)
    a = x - x.mean(axis=-1, keepdims=True)
    den = (a * a).sum(axis=-1)
    num = (a[..., 1:] * a[..., :-1]).sum(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), 0.0)


def wilks_block_length(n: int, r1: np.ndarray | float) -> np.ndarray:
    """Block length L solving L = (n - L + 1)^((2/3)(1 - n'/n)), n' = n(1 - r1)/(1 + r1) (Wilks 1997).

    The right side falls as L grows, so the root is unique in [1, n] and bisection finds it. L is
    rounded to the nearest integer and is 1 for r1 <= 0 (no positive serial correlation to preserve).
    """
    r1 = np.clip(np.asarray(r1, dtype=np.float64), -0.999, 0.999)
    n_eff = n * (1 - r1) / (1 + r1)
    expo = np.maximum((2.0 / 3.0) * (1 - n_eff / n), 0.0)
    lo, hi = np.ones_like(r1), np.full_like(r1, float(n))
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        above = mid - (n - mid + 1) ** expo > 0
        hi, lo = np.where(above, mid, hi), np.where(above, lo, mid)
    return np.clip(np.rint(0.5 * (lo + hi)), 1, n).astype(np.int64)


def correlation_length(x: np.ndarray) -> np.ndarray:
    """Wilks block length of each series (last axis), from its own lag-1 autocorrelation."""
    x = np.asarray(x, dtype=np.float64)
    return wilks_block_length(x.shape[-1], lag1_autocorrelation(x))


def check_series_length(n: int, block_length: int, what: str) -> None:
    if n < max(MIN_SERIES_LENGTH, 2 * block_length):
        raise DataError(f"{what}: {n} initialisations are too few for the block bootstrap with correlation "
                        f"length {block_length} (need at least {max(MIN_SERIES_LENGTH, 2 * block_length)})")


def circular_block_indices(n: int, block_length: int | np.ndarray, n_resamples: int,
                           rng: np.random.Generator) -> np.ndarray:
    """Indices of a circular moving-block bootstrap, shape (*batch, n_resamples, n).

    Each resample is ceil(n/L) blocks of L consecutive indices with uniform random starts, wrapped
    around the end of the series (so every observation is equally likely to be drawn) and cut to n.
    `block_length` may be an array (one length per batch row).
    """
    length = np.asarray(block_length, dtype=np.int64)
    if np.any(length < 1) or np.any(length > n):
        raise DataError(f"block length must lie in [1, {n}], got {block_length}")
    n_blocks = int(-(-n // int(length.min())))
    starts = rng.integers(0, n, size=(*length.shape, n_resamples, n_blocks))
    pos = np.arange(n)
    ln = length[..., None, None]
    block_of = pos // ln  # (*batch, 1, n)
    start = np.take_along_axis(starts, np.broadcast_to(block_of, (*length.shape, n_resamples, n)), axis=-1)
    return (start + pos % ln) % n


@dataclass(frozen=True)
class Interval:
    estimate: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    block_length: np.ndarray


def block_bootstrap(series: Sequence[np.ndarray], statistic: Callable[..., np.ndarray],
                    block_length: int | np.ndarray | None = None, n_resamples: int = 5000,
                    confidence: float = 0.95, seed: int | np.random.Generator = 0,
                    indices: np.ndarray | None = None) -> Interval:
    """Percentile interval of `statistic(*series)` from a circular moving-block bootstrap.

    `statistic` reduces the last axis (e.g. `lambda m: np.sqrt(m.mean(-1))` for an RMSE from an MSE
    series), so nonlinear aggregates are recomputed on every resample. All series are resampled with
    the same indices: paired when comparing two models. The default block length is the largest
    correlation length among the series.
    """
    arrays = [np.asarray(s, dtype=np.float64) for s in series]
    n = arrays[0].shape[-1]
    if any(a.shape[-1] != n for a in arrays):
        raise DataError("paired series must have the same length")
    if block_length is None:
        block_length = np.max(np.stack(np.broadcast_arrays(*[correlation_length(a) for a in arrays])), axis=0)
    if indices is None:
        rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
        indices = circular_block_indices(n, block_length, n_resamples, rng)
    resampled = [np.take_along_axis(a[..., None, :], indices, axis=-1) if indices.ndim == a.ndim + 1
                 else a[..., indices] for a in arrays]
    draws = statistic(*resampled)
    alpha = (1 - confidence) / 2
    with np.errstate(invalid="ignore"):  # a ratio with a zero denominator gives inf draws: inf - inf
        lower, upper = np.nanquantile(draws, [alpha, 1 - alpha], axis=-1)
    return Interval(np.asarray(statistic(*arrays)), lower, upper, np.asarray(block_length))


def bartlett_long_run_variance(d: np.ndarray, lag: int | np.ndarray) -> np.ndarray:
    """Newey-West HAC variance gamma_0 + 2 sum_{k=1..l} (1 - k/(l+1)) gamma_k (autocovariances / n).

    Bartlett weights keep the estimate non-negative, unlike the truncated (uniform) kernel.
    """
    d = np.asarray(d, dtype=np.float64)
    n = d.shape[-1]
    lag = np.asarray(lag, dtype=np.int64)
    a = d - d.mean(axis=-1, keepdims=True)
    total = (a * a).sum(axis=-1) / n
    for k in range(1, int(lag.max(initial=0)) + 1):
        gamma = (a[..., k:] * a[..., :-k]).sum(axis=-1) / n
        total = total + 2 * np.clip(1 - k / (lag + 1), 0, None) * gamma
    return total


@dataclass(frozen=True)
class DMResult:
    statistic: np.ndarray
    p_value: np.ndarray
    mean_difference: np.ndarray
    lag: np.ndarray
    n: int


def diebold_mariano(loss_a: np.ndarray, loss_b: np.ndarray, lag: int | np.ndarray | None = None) -> DMResult:
    """Diebold-Mariano test of equal expected loss, two-sided, on paired per-initialisation losses.

    d = loss_a - loss_b; DM = dbar / sqrt(V/n) with V the Bartlett HAC variance at lag truncation l,
    scaled by the Harvey-Leybourne-Newbold factor sqrt((n + 1 - 2h + h(h-1)/n)/n) with h = l + 1
    (covariances up to lag h-1 = l enter V) and referred to Student-t with n-1 degrees of freedom.
    For l = 0 this is HLN's own statistic (scores' `diebold_mariano(method="HLN")` with h = 1).
    A negative statistic means model a has the lower loss.
    """
    d = np.asarray(loss_a, dtype=np.float64) - np.asarray(loss_b, dtype=np.float64)
    n = d.shape[-1]
    if lag is None:
        lag = correlation_length(d)
    lag = np.asarray(lag, dtype=np.int64)
    h = lag + 1
    hln = (n + 1 - 2 * h + h * (h - 1) / n) / n
    if np.any(hln <= 0) or n < 3:
        raise DataError(f"Diebold-Mariano: {n} initialisations are too few for lag truncation {lag.max()}")
    var = bartlett_long_run_variance(d, lag)
    dbar = d.mean(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        stat = np.sqrt(hln) * dbar / np.sqrt(var / n)
    stat = np.where(var > 0, stat, np.nan)
    p = 2 * sps.t.sf(np.abs(stat), df=n - 1)
    return DMResult(stat, p, dbar, lag, n)
