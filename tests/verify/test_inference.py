"""Per-initialisation series statistics: Wilks block length, circular block bootstrap, Diebold-Mariano."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats as sps
import xarray as xr
from arch.bootstrap import CircularBlockBootstrap
from arch.covariance.kernel import Bartlett
from scores.stats.statistical_tests import diebold_mariano as scores_dm

from wxray.errors import DataError
from wxray.verify import (
    bartlett_long_run_variance,
    block_bootstrap,
    circular_block_indices,
    correlation_length,
    diebold_mariano,
    lag1_autocorrelation,
    wilks_block_length,
)
from wxray.verify.inference import check_series_length


def ar1(rng: np.random.Generator, trials: int, n: int, phi: float) -> np.ndarray:
    """Stationary AR(1) series with unit innovations, one per row."""
    e = rng.standard_normal((trials, n))
    x = np.empty_like(e)
    x[:, 0] = e[:, 0] / np.sqrt(1 - phi**2)
    for t in range(1, n):
        x[:, t] = phi * x[:, t - 1] + e[:, t]
    return x


def test_wilks_block_length_solves_its_equation():
    # n = 100, r1 = 0.6: n' = 25, exponent 1/2, so L^2 + L - 101 = 0 and L = 9.56 -> 10.
    assert int(wilks_block_length(100, 0.6)) == 10
    assert int(wilks_block_length(100, 0.0)) == 1 and int(wilks_block_length(100, -0.4)) == 1
    lengths = wilks_block_length(337, np.array([0.1, 0.3, 0.5, 0.7, 0.9]))
    assert np.all(np.diff(lengths) > 0)
    r1 = lag1_autocorrelation(ar1(np.random.default_rng(0), 1, 20000, 0.6)[0])
    assert float(r1) == pytest.approx(0.6, abs=0.02)


def test_circular_block_indices_are_wrapped_blocks():
    rng = np.random.default_rng(1)
    n, ell = 50, 7
    idx = circular_block_indices(n, ell, 400, rng)
    assert idx.shape == (400, n)
    blocks = idx[:, : (n // ell) * ell].reshape(400, n // ell, ell)
    np.testing.assert_array_equal(np.diff(blocks, axis=-1) % n, 1)  # consecutive, wrapping at the end
    counts = np.bincount(idx.ravel(), minlength=n)
    # Circular blocks draw every observation equally often (a non-circular one under-draws the ends).
    assert counts.min() > 0.85 * counts.mean() and counts.max() < 1.15 * counts.mean()


def test_bootstrap_variance_of_the_mean_matches_closed_form_and_arch():
    rng = np.random.default_rng(2)
    n, ell = 120, 8  # ell divides n: the bootstrap mean is the mean of n/ell iid circular block means
    x = ar1(rng, 1, n, 0.6)[0]
    block_means = np.array([np.take(x, np.arange(i, i + ell), mode="wrap").mean() for i in range(n)])
    exact = block_means.var() / (n // ell)
    idx = circular_block_indices(n, ell, 20000, rng)
    ours = x[idx].mean(-1).var()
    assert ours == pytest.approx(exact, rel=0.05)  # sampling sd of a 20000-draw variance: ~1%
    arch_var = CircularBlockBootstrap(ell, x, seed=3).var(np.mean, reps=4000)
    assert float(np.squeeze(arch_var)) == pytest.approx(exact, rel=0.1)  # ~2.2% sampling sd


def test_block_bootstrap_coverage_of_ar1_mean():
    """95% percentile intervals of the mean of AR(1) r1=0.6 series cover the true mean 0.

    With n=1000 the method's coverage is ~0.925 (it is mildly liberal: ~0.91 at n=200-340); 1200 trials
    give a sampling sd of ~0.008. A block-free (i.i.d.) bootstrap covers only ~0.67.
    """
    rng = np.random.default_rng(4)
    n, trials = 1000, 1200
    x = ar1(rng, trials, n, 0.6)
    lengths = correlation_length(x)
    covered = iid_covered = 0
    for ell in np.unique(lengths):  # one index set per block length, shared by the trials that use it
        rows = np.flatnonzero(lengths == ell)
        for chunk in np.array_split(rows, -(-len(rows) // 100)):
            ci = block_bootstrap([x[chunk]], lambda a: a.mean(-1), block_length=int(ell), n_resamples=300,
                                 seed=rng)
            covered += int(((ci.lower < 0) & (ci.upper > 0)).sum())
            iid = block_bootstrap([x[chunk]], lambda a: a.mean(-1), block_length=1, n_resamples=300, seed=rng)
            iid_covered += int(((iid.lower < 0) & (iid.upper > 0)).sum())
    assert 0.90 <= covered / trials <= 0.98
    assert iid_covered / trials < 0.8


def test_paired_bootstrap_recomputes_nonlinear_aggregates():
    rng = np.random.default_rng(5)
    mse_a = 1.0 + 0.3 * ar1(rng, 1, 200, 0.5)[0] ** 2
    mse_b = mse_a * 1.2 + 0.01 * rng.standard_normal(200)  # b is ~20% worse, tightly paired

    def rel(a, b):
        return np.sqrt(a.mean(-1)) / np.sqrt(b.mean(-1)) - 1

    ci = block_bootstrap([mse_a, mse_b], rel, n_resamples=2000, seed=6)
    assert float(ci.estimate) == pytest.approx(np.sqrt(mse_a.mean() / mse_b.mean()) - 1, rel=1e-12)
    assert ci.lower < ci.estimate < ci.upper
    # Pairing cancels the shared fluctuations: the interval is far narrower than the spread of either series.
    assert ci.upper - ci.lower < 0.01
    unpaired = block_bootstrap([mse_a], lambda a: np.sqrt(a.mean(-1)), n_resamples=2000, seed=6)
    assert (unpaired.upper - unpaired.lower) / float(unpaired.estimate) > 5 * (ci.upper - ci.lower)


def test_series_too_short_for_the_bootstrap():
    with pytest.raises(DataError, match="too few"):
        check_series_length(3, 1, "temperature_850 lead 24 h")
    with pytest.raises(DataError, match="correlation length 4"):
        check_series_length(7, 4, "temperature_850 lead 24 h")
    check_series_length(8, 4, "ok")


def test_bartlett_variance_matches_arch():
    x = ar1(np.random.default_rng(7), 1, 300, 0.5)[0]
    for lag in (0, 1, 5, 12):
        ref = Bartlett(x, bandwidth=lag, center=True).cov.long_run
        assert float(bartlett_long_run_variance(x, lag)) == pytest.approx(float(np.squeeze(ref)), rel=1e-10)


def test_diebold_mariano_at_lag_zero_equals_scores_hln():
    rng = np.random.default_rng(8)
    d = 0.2 + rng.standard_normal(60)
    ours = diebold_mariano(d, np.zeros_like(d), lag=0)
    da = xr.DataArray(d[None], dims=("series", "init"), coords={"h": ("series", [1])})
    ref = scores_dm(da, "series", "h", method="HLN", statistic_distribution="t")
    assert float(ours.statistic) == pytest.approx(float(ref["dm_test_stat"][0]), rel=1e-10)
    cdf = float(ref["confidence_gt_0"][0])
    assert float(ours.p_value) == pytest.approx(2 * min(cdf, 1 - cdf), rel=1e-10)
    assert float(ours.p_value) == pytest.approx(2 * sps.t.sf(abs(float(ours.statistic)), 59), rel=1e-12)


def test_diebold_mariano_size_and_power_on_ar1_loss_differentials():
    rng = np.random.default_rng(9)
    trials, n = 4000, 300
    d = ar1(rng, trials, n, 0.5)
    null = diebold_mariano(d, np.zeros_like(d))  # lag from each series' own correlation length
    size = float(np.mean(null.p_value < 0.05))
    # Bartlett weights at the Wilks length leave the test slightly liberal (~7%); sampling sd 0.4%.
    assert 0.03 <= size <= 0.10
    naive = diebold_mariano(d, np.zeros_like(d), lag=0)  # ignoring the autocorrelation
    assert float(np.mean(naive.p_value < 0.05)) > 0.2
    power = diebold_mariano(d[:500] + 1.0, np.zeros((500, n)))  # mean difference of 5 standard errors
    assert float(np.mean(power.p_value < 0.05)) > 0.99
    assert np.all(power.statistic > 0)


def test_diebold_mariano_rejects_too_short_series():
    with pytest.raises(DataError, match="too few"):
        diebold_mariano(np.ones(2), np.zeros(2), lag=1)
