"""Statistics on per-initialisation score series: intervals and Diebold-Mariano tests robust to autocorrelation.

Every series here has one value per initialisation (a score already averaged over space), time on the
last axis. Spatial correlation is absorbed by that mean; what is left is the serial correlation between
nearby initialisations. Leading axes are batch axes (e.g. independent Monte Carlo trials): vectorised.

Two methods (`METHODS`):

* "fixed-b" (default): one t statistic for the test and the interval. Its variance is a Bartlett HAC
  estimate after AR(1) prewhitening with a bias-corrected lag-1 autocorrelation, bandwidth M = ceil(2 sqrt n),
  inflated for the estimated autocorrelation; critical values and p-values come from the fixed-b limit
  (Kiefer & Vogelsang 2005), which accounts for the randomness of the variance estimate. A nonlinear
  statistic is linearised by the jackknife. Chosen by measurement (benchmarks/bench_significance.py,
  BENCHMARKS.md section 3): on AR(1) loss differentials with n in 60..730 and lag-1 autocorrelation 0..0.8
  it rejects a true null 4.4-6.0% of the time at the 5% level and its 95% intervals cover 94.0-95.6%
  (the paper method: 5-18% and 73-95%). At n = 60, r1 = 0.8 un-prewhitened fixed-b gave 16% with an
  Andrews bandwidth and 11% even at b = 1, prewhitening with the raw r1 8%, with the bias-corrected one
  6.6%; the inflation brings it to ~5.8%. A percentile bootstrap with Politis-White blocks covered 75%.
  It needs n >= 6 (`MIN_FIXED_B_LENGTH`), a DataError below: measured on 20000 null series each (white
  noise and AR(1) with r1 0.3..0.8), no correction holds the level at n = 4-5. The bias-corrected r1 is
  undefined there and capped at 0.97, which rejected 0% and gave intervals 90-440 times the true standard
  error; the raw r1 or a cap of 0.5 rejected 14-56%, no prewhitening 8-49%. At n = 6-12 the test is still
  liberal (7-19% at 5%, worst for strong autocorrelation), so a short series' p-values are rough.
* "paper": the uncertainty paper's procedure. Block length by Wilks (1997), percentile intervals from a
  circular moving-block bootstrap, DM with a Bartlett variance at that lag, the HLN factor and Student-t.
  Liberal on short or strongly autocorrelated series (12% at n = 60, r1 = 0.7; 18% at r1 = 0.8).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

from wxray.errors import DataError

MIN_SERIES_LENGTH = 4  # the block bootstrap ("paper"; also n >= 2 L)
MIN_FIXED_B_LENGTH = 6  # the fixed-b method (module docstring): the bias-corrected r1 needs n > 5
METHODS = ("fixed-b", "paper")
DEFAULT_METHOD = "fixed-b"
RHO_CAP = 0.97  # prewhitening coefficient cap (Andrews & Monahan 1992): 1/(1 - rho) stays finite


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


def check_method(method: str) -> None:
    if method not in METHODS:
        raise DataError(f"significance method must be one of {', '.join(METHODS)}, got {method!r}")


def min_series_length(block_length: int | None) -> int:
    """The fewest initialisations the intervals take: max(4, 2L) for the bootstrap with block length L,
    `MIN_FIXED_B_LENGTH` = 6 for fixed-b (`block_length` None; see the module docstring)."""
    return MIN_FIXED_B_LENGTH if block_length is None else max(MIN_SERIES_LENGTH, 2 * block_length)


def check_series_length(n: int, block_length: int | None, what: str) -> None:
    """Enough initialisations for the bootstrap (`block_length` L: n >= max(4, 2L)), or for fixed-b (None:
    n >= `MIN_FIXED_B_LENGTH` = 6, see the module docstring)."""
    if block_length is None:
        if n < MIN_FIXED_B_LENGTH:
            raise DataError(f"{what}: {n} initialisations are too few for the fixed-b HAC variance "
                            f"(need at least {MIN_FIXED_B_LENGTH}; significance_method=paper needs "
                            f"{MIN_SERIES_LENGTH})")
        return
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


def bias_corrected_lag1(x: np.ndarray) -> np.ndarray:
    """rho = (n r1 + 1) / (n - 4), clipped to [-0.97, 0.97]: r1 with its small-sample bias removed.

    For AR(1) with an estimated mean, E[r1] = rho - (1 + 3 rho)/n (Marriott & Pope 1954) - rho/n (this
    r1 divides by n squares, not n - 1); solving for rho gives the formula. Measured bias below 0.004 for
    n >= 60, rho <= 0.8, where r1 itself is 0.07 low at n = 60, rho = 0.8. Needs n >= `MIN_FIXED_B_LENGTH`
    (at n = 5 the denominator is 1 and at n = 4 zero: a DataError, not a made-up value).
    """
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[-1]
    if n < MIN_FIXED_B_LENGTH:
        raise DataError(f"bias-corrected lag-1 autocorrelation: {n} initialisations are too few "
                        f"(need at least {MIN_FIXED_B_LENGTH})")
    return np.clip((n * lag1_autocorrelation(x) + 1) / (n - 4), -RHO_CAP, RHO_CAP)


def hac_bandwidth(n: int) -> int:
    """Bartlett bandwidth M = ceil(2 sqrt n) (lags k < M enter with weight 1 - k/M), at most n - 1.

    Fixed-b critical values absorb the randomness of the variance for any b = M/(n - 1); measured on AR(1)
    (BENCHMARKS.md section 3), 2 sqrt n holds the level at n = 60 as well as b = 0.3 does and at n >= 337
    keeps 8-9 points more power; smaller M (b -> 0 as n grows) is safe only because of the prewhitening.
    """
    return int(min(np.ceil(2 * np.sqrt(n)), max(n - 1, 1)))


def prewhitened_long_run_variance(x: np.ndarray, bandwidth: int | None = None) -> np.ndarray:
    """V = V_B(e; M) / (1 - rho)^2 * (1 + (1 + rho) / (n (1 - rho))), e_t = a_t - rho a_{t-1}, a = x - xbar.

    rho is `bias_corrected_lag1`, V_B the Bartlett HAC variance of the n - 1 residuals at bandwidth M
    (default `hac_bandwidth(n)`). Recolouring by 1/(1 - rho)^2 is consistent whatever rho is (the filter's
    gain at frequency 0); prewhitening only takes the smoothing bias out of V_B (Andrews & Monahan 1992).
    The last factor, 1 + 1/n_eff with n_eff = n (1 - rho)/(1 + rho), is the first-order inflation of the
    squared t statistic by the sampling variance (1 - rho^2)/n of rho relative to (1 - rho)^2.
    """
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[-1]
    if n < MIN_FIXED_B_LENGTH:
        raise DataError(f"HAC variance: {n} initialisations are too few (need at least {MIN_FIXED_B_LENGTH})")
    m = hac_bandwidth(n) if bandwidth is None else int(bandwidth)
    if not 1 <= m <= n - 1:
        raise DataError(f"HAC bandwidth must lie in [1, {n - 1}], got {m}")
    rho = bias_corrected_lag1(x)
    a = x - x.mean(axis=-1, keepdims=True)
    e = a[..., 1:] - rho[..., None] * a[..., :-1]
    inflation = 1 + (1 + rho) / (n * (1 - rho))
    return bartlett_long_run_variance(e, m - 1) / (1 - rho) ** 2 * inflation


# Fixed-b limit of the Bartlett t statistic, approximated as s(b) * Student-t(nu(b)): s and 1/nu are cubic
# fits to quantiles (levels 90-99%) of 300000 simulated limits (n = 1000) on 19 values of b in [0.01, 1]
# (`bench_significance.py --fit-fixed-b`); its 10%, 5% and 1% tails hold 9.8-10.0%, 4.98-5.09% and 0.97-1.01%
# of the simulated limits. At 5% it reproduces Kiefer & Vogelsang's (2005) c(b) = 1.96 + 2.9694 b + 0.4160 b^2
# - 0.5324 b^3 within 1.5% (our simulated quantiles lie 0.3-1% below it).
_FIXED_B_SCALE = (0.5086, 1.0006, -0.5377)
_FIXED_B_INV_DF = (0.6668, -0.9115, 0.4013)


def _fixed_b_law(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    b = np.clip(np.asarray(b, dtype=np.float64), 1e-6, 1.0)
    scale = 1 + sum(c * b ** (k + 1) for k, c in enumerate(_FIXED_B_SCALE))
    return scale, 1 / sum(c * b ** (k + 1) for k, c in enumerate(_FIXED_B_INV_DF))


def fixed_b_p_value(t: np.ndarray, b: np.ndarray | float) -> np.ndarray:
    """Two-sided p = P(|T_b| > |t|) = 2 P(t_nu(b) > |t| / s(b)) under the fixed-b limit T_b (Bartlett)."""
    scale, df = _fixed_b_law(b)
    return 2 * sps.t.sf(np.abs(t) / scale, df)


def fixed_b_critical_value(b: np.ndarray | float, confidence: float = 0.95) -> np.ndarray:
    """c with P(|T_b| <= c) = confidence: s(b) t_nu(b) quantile at (1 + confidence)/2."""
    scale, df = _fixed_b_law(b)
    return scale * sps.t.ppf((1 + confidence) / 2, df)


def jackknife_influence(series: Sequence[np.ndarray], statistic: Callable[..., np.ndarray]) -> np.ndarray:
    """u_t = (n - 1)(mean_s T_(-s) - T_(-t)), T_(-t) the statistic without initialisation t in every series.

    The empirical influence of each initialisation (paired: t leaves all series together); for the mean it
    is x_t - xbar exactly, for a smooth function of means its linearisation. `statistic` reduces the last
    axis and must not depend on the order of the initialisations (true of means and functions of means).
    """
    arrays = [np.asarray(s, dtype=np.float64) for s in series]
    n = arrays[0].shape[-1]
    if any(a.shape[-1] != n for a in arrays):
        raise DataError("paired series must have the same length")
    j = np.arange(n - 1)[None, :]
    keep = j + (j >= np.arange(n)[:, None])  # row t: every index but t
    batch = int(np.prod(np.broadcast_shapes(*[a.shape[:-1] for a in arrays]), dtype=np.int64))
    step = max(1, int(4e6 // max(batch * n * len(arrays), 1)))  # rows per chunk: ~32 MB of leave-one-out copies
    with np.errstate(divide="ignore", invalid="ignore"):
        loo = np.concatenate([statistic(*[a[..., keep[i:i + step]] for a in arrays])
                              for i in range(0, n, step)], axis=-1)
        return (n - 1) * (loo.mean(axis=-1, keepdims=True) - loo)


def hac_interval(series: Sequence[np.ndarray], statistic: Callable[..., np.ndarray], confidence: float = 0.95,
                 bandwidth: int | None = None) -> Interval:
    """Fixed-b interval T +- c(b) sqrt(V(u)/n): T = statistic(*series), u its jackknife influence values.

    V is `prewhitened_long_run_variance`, b = M/(n - 1). For the mean this is the interval the fixed-b DM
    test inverts; a ratio or root of means is linearised, so its interval is symmetric (at the n of a
    scorecard the curvature is small next to the width). `block_length` of the result is the bandwidth M.
    """
    arrays = [np.asarray(s, dtype=np.float64) for s in series]
    n = arrays[0].shape[-1]
    m = hac_bandwidth(n) if bandwidth is None else int(bandwidth)
    estimate = np.asarray(statistic(*arrays), dtype=np.float64)
    u = jackknife_influence(arrays, statistic)
    finite = np.isfinite(u).all(axis=-1)
    var = prewhitened_long_run_variance(np.where(finite[..., None], u, 0.0), m)
    half = fixed_b_critical_value(m / (n - 1), confidence) * np.sqrt(np.where(finite, var, np.nan) / n)
    return Interval(estimate, estimate - half, estimate + half, np.asarray(m))


@dataclass(frozen=True)
class DMResult:
    statistic: np.ndarray
    p_value: np.ndarray
    mean_difference: np.ndarray
    lag: np.ndarray
    n: int


def diebold_mariano(loss_a: np.ndarray, loss_b: np.ndarray, lag: int | np.ndarray | None = None,
                    method: str = DEFAULT_METHOD) -> DMResult:
    """Diebold-Mariano test of equal expected loss, two-sided, on paired per-initialisation losses.

    d = loss_a - loss_b. "fixed-b": DM = dbar / sqrt(V/n), V = `prewhitened_long_run_variance(d, M)` with
    M = lag + 1 (default `hac_bandwidth(n)`), p from the fixed-b limit at b = M/(n - 1).
    "paper": V the Bartlett HAC variance at lag truncation l (default the Wilks correlation length), scaled
    by the Harvey-Leybourne-Newbold factor sqrt((n + 1 - 2h + h(h-1)/n)/n) with h = l + 1 (covariances up
    to lag h-1 = l enter V) and referred to Student-t with n-1 degrees of freedom; for l = 0 this is HLN's
    own statistic (scores' `diebold_mariano(method="HLN")` with h = 1).
    A negative statistic means model a has the lower loss. `lag` of the result is M - 1 or l.
    """
    check_method(method)
    d = np.asarray(loss_a, dtype=np.float64) - np.asarray(loss_b, dtype=np.float64)
    n = d.shape[-1]
    dbar = d.mean(axis=-1)
    if method == "fixed-b":
        if n < MIN_FIXED_B_LENGTH:
            raise DataError(f"Diebold-Mariano: {n} initialisations are too few for the fixed-b test "
                            f"(need at least {MIN_FIXED_B_LENGTH})")
        m = hac_bandwidth(n) if lag is None else int(np.max(lag)) + 1
        var = prewhitened_long_run_variance(d, m)
        with np.errstate(divide="ignore", invalid="ignore"):
            stat = np.where(var > 0, dbar / np.sqrt(var / n), np.nan)
        return DMResult(stat, fixed_b_p_value(stat, m / (n - 1)), dbar, np.asarray(m - 1), n)
    if lag is None:
        lag = correlation_length(d)
    lag = np.asarray(lag, dtype=np.int64)
    h = lag + 1
    hln = (n + 1 - 2 * h + h * (h - 1) / n) / n
    if np.any(hln <= 0) or n < 3:
        raise DataError(f"Diebold-Mariano: {n} initialisations are too few for lag truncation {lag.max()}")
    var = bartlett_long_run_variance(d, lag)
    with np.errstate(divide="ignore", invalid="ignore"):
        stat = np.sqrt(hln) * dbar / np.sqrt(var / n)
    stat = np.where(var > 0, stat, np.nan)
    p = 2 * sps.t.sf(np.abs(stat), df=n - 1)
    return DMResult(stat, p, dbar, lag, n)
