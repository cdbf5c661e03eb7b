"""Per-initialisation series statistics: the paper's Wilks block bootstrap and HLN Diebold-Mariano, and the
default fixed-b method (prewhitened Bartlett HAC, fixed-b critical values) that holds its nominal level."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.signal as sps_signal
import scipy.stats as sps
import xarray as xr
from arch.bootstrap import CircularBlockBootstrap
from arch.covariance.kernel import Bartlett
from scores.stats.statistical_tests import diebold_mariano as scores_dm

from wxray.errors import DataError
from wxray.verify.inference import (
    bartlett_long_run_variance,
    bias_corrected_lag1,
    block_bootstrap,
    check_series_length,
    circular_block_indices,
    correlation_length,
    diebold_mariano,
    fixed_b_critical_value,
    fixed_b_p_value,
    hac_bandwidth,
    hac_interval,
    jackknife_influence,
    lag1_autocorrelation,
    wilks_block_length,
)


def ar1(rng: np.random.Generator, trials: int, n: int, phi: float) -> np.ndarray:
    """Stationary AR(1) series with unit innovations, one per row."""
    e = rng.standard_normal((trials, n))
    e[:, 0] /= np.sqrt(1 - phi**2)
    return sps_signal.lfilter([1.0], [1.0, -phi], e, axis=-1)


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
    check_series_length(4, 2, "ok")  # the bootstrap runs from 4
    for n in (3, 4, 5):
        with pytest.raises(DataError, match=rf"^temperature_850 lead 24 h: {n} initialisations are too few for "
                                            r"the fixed-b HAC variance \(need at least 6; significance_method="
                                            r"paper needs 4\)$"):
            check_series_length(n, None, "temperature_850 lead 24 h")
    check_series_length(6, None, "ok")


def test_bartlett_variance_matches_arch():
    x = ar1(np.random.default_rng(7), 1, 300, 0.5)[0]
    for lag in (0, 1, 5, 12):
        ref = Bartlett(x, bandwidth=lag, center=True).cov.long_run
        assert float(bartlett_long_run_variance(x, lag)) == pytest.approx(float(np.squeeze(ref)), rel=1e-10)


def test_diebold_mariano_at_lag_zero_equals_scores_hln():
    rng = np.random.default_rng(8)
    d = 0.2 + rng.standard_normal(60)
    ours = diebold_mariano(d, np.zeros_like(d), lag=0, method="paper")
    da = xr.DataArray(d[None], dims=("series", "init"), coords={"h": ("series", [1])})
    ref = scores_dm(da, "series", "h", method="HLN", statistic_distribution="t")
    assert float(ours.statistic) == pytest.approx(float(ref["dm_test_stat"][0]), rel=1e-10)
    cdf = float(ref["confidence_gt_0"][0])
    assert float(ours.p_value) == pytest.approx(2 * min(cdf, 1 - cdf), rel=1e-10)
    assert float(ours.p_value) == pytest.approx(2 * sps.t.sf(abs(float(ours.statistic)), 59), rel=1e-12)


def test_paper_diebold_mariano_size_and_power_on_ar1_loss_differentials():
    rng = np.random.default_rng(9)
    trials, n = 4000, 300
    d = ar1(rng, trials, n, 0.5)
    null = diebold_mariano(d, np.zeros_like(d), method="paper")  # lag from each series' correlation length
    size = float(np.mean(null.p_value < 0.05))
    # Bartlett weights at the Wilks length leave the test slightly liberal (~7%); sampling sd 0.4%.
    assert 0.03 <= size <= 0.10
    naive = diebold_mariano(d, np.zeros_like(d), lag=0, method="paper")  # ignoring the autocorrelation
    assert float(np.mean(naive.p_value < 0.05)) > 0.2
    power = diebold_mariano(d[:500] + 1.0, np.zeros((500, n)), method="paper")  # 5 standard errors
    assert float(np.mean(power.p_value < 0.05)) > 0.99
    assert np.all(power.statistic > 0)


def test_diebold_mariano_rejects_too_short_series_and_unknown_methods():
    with pytest.raises(DataError, match="too few"):
        diebold_mariano(np.ones(2), np.zeros(2), lag=1, method="paper")
    for n in (3, 4, 5):
        with pytest.raises(DataError, match=f"{n} initialisations are too few for the fixed-b test"):
            diebold_mariano(np.arange(n, dtype=float), np.zeros(n))
        with pytest.raises(DataError, match=f"HAC variance: {n} initialisations are too few"):
            hac_interval([np.arange(n, dtype=float)], lambda a: a.mean(-1))
    with pytest.raises(DataError, match="one of fixed-b, paper"):
        diebold_mariano(np.ones(10), np.zeros(10), method="bootstrap")


def test_fixed_b_critical_values_match_kiefer_vogelsang():
    # KV (2005) fit to their simulated 97.5% quantiles of the Bartlett fixed-b limit; ours is a scaled-t fit to
    # our own simulation (bench_significance.py --fit-fixed-b), 0.5-1% below theirs at b >= 0.1.
    b = np.array([0.02, 0.1, 0.3, 0.5, 0.8, 1.0])
    kv = 1.96 + 2.9694 * b + 0.4160 * b**2 - 0.5324 * b**3
    np.testing.assert_allclose(fixed_b_critical_value(b), kv, rtol=0.015)
    assert float(fixed_b_critical_value(1e-6)) == pytest.approx(1.96, abs=0.01)  # b -> 0: the normal
    np.testing.assert_allclose(fixed_b_p_value(fixed_b_critical_value(b, 0.9), b), 0.1, rtol=1e-10)
    assert hac_bandwidth(60) == 16 and hac_bandwidth(730) == 55 and hac_bandwidth(4) == 3


def test_bias_corrected_lag1_is_unbiased_where_r1_is_not():
    rng = np.random.default_rng(10)
    x = ar1(rng, 4000, 60, 0.8)
    assert float(lag1_autocorrelation(x).mean()) == pytest.approx(0.73, abs=0.01)  # 0.07 low
    assert float(bias_corrected_lag1(x).mean()) == pytest.approx(0.8, abs=0.01)  # sampling sd ~0.0015
    assert float(bias_corrected_lag1(np.ones(30))) == pytest.approx(1 / 26)  # constant: r1 = 0
    with pytest.raises(DataError, match="5 initialisations are too few"):  # (n r1 + 1)/(n - 4): no estimate
        bias_corrected_lag1(np.arange(5.0))


def test_jackknife_influence_linearises_paired_statistics():
    rng = np.random.default_rng(11)
    x = ar1(rng, 3, 50, 0.5)
    np.testing.assert_allclose(jackknife_influence([x], lambda a: a.mean(-1)), x - x.mean(-1, keepdims=True),
                               atol=1e-12)
    a, b = 5 + x[0], 6 + x[1]
    u = jackknife_influence([a, b], lambda p, q: p.mean(-1) / q.mean(-1))
    delta = (a - a.mean()) / b.mean() - a.mean() * (b - b.mean()) / b.mean() ** 2  # delta method
    np.testing.assert_allclose(u, delta, atol=0.01 * np.abs(delta).max())
    n = 4000  # large n: the leave-one-out statistics are computed in chunks
    assert np.allclose(jackknife_influence([np.arange(n, dtype=float)], lambda v: v.mean(-1)), np.arange(n) - 1999.5)


def test_fixed_b_interval_is_the_inverted_test():
    """The mean's interval holds exactly the shifts the test does not reject, at the same level."""
    rng = np.random.default_rng(12)
    d = ar1(rng, 5, 80, 0.6) + 0.3
    ci = hac_interval([d], lambda a: a.mean(-1))
    assert int(ci.block_length) == hac_bandwidth(80)
    for bound in (ci.lower, ci.upper):
        dm = diebold_mariano(d - bound[:, None], np.zeros_like(d))
        np.testing.assert_allclose(dm.p_value, 0.05, rtol=1e-8)
    flat = hac_interval([np.full(20, 2.0)], lambda a: a.mean(-1))  # no variation: a zero-width interval
    assert float(flat.lower) == float(flat.upper) == 2.0
    same = diebold_mariano(np.ones(20), np.ones(20))  # identical losses: no test
    assert np.isnan(same.statistic) and np.isnan(same.p_value)


@pytest.mark.parametrize("n, phi", [(60, 0.8), (100, 0.5)])
def test_default_holds_its_level_where_the_paper_method_does_not(n, phi):
    """Fixed seed, 4000 AR(1) null series: the default rejects 5% +- 1.5 points (sampling sd 0.35), covers 95%.

    Measured (BENCHMARKS.md section 3): fixed-b 5.7-6.0% at n = 60, r1 = 0.8 and ~5% at n = 100, r1 = 0.5; the
    paper method 16-18% and 8-9.5%, so a regression to it (or to un-prewhitened HAC, 11-16%) fails here.
    """
    rng = np.random.default_rng(13)
    d = ar1(rng, 4000, n, phi)
    reject = diebold_mariano(d, np.zeros_like(d)).p_value < 0.05
    assert 0.035 <= float(reject.mean()) <= 0.065 + 0.01  # 0.01: three sampling sds of slack
    ci = hac_interval([d], lambda a: a.mean(-1))
    covered = (ci.lower < 0) & (ci.upper > 0)
    np.testing.assert_array_equal(covered, ~reject)  # the interval inverts the test
    x, y = ar1(rng, 1000, n, phi), ar1(rng, 1000, n, phi)  # relative RMSE of two equally good models
    level = 4 / np.sqrt(1 - phi**2)
    rel = hac_interval([level + x, level + y], lambda a, b: np.sqrt(a.mean(-1)) / np.sqrt(b.mean(-1)) - 1)
    assert 0.925 - 0.02 <= float(np.mean((rel.lower < 0) & (rel.upper > 0))) <= 0.975 + 0.02  # sd 0.7 points


def _scorecard_inputs(tmp_path):
    from tests.verify.conftest import make_store
    from wxray.data.schema import channels, open_store
    from wxray.verify.forecasts import persistence_forecast

    ds = open_store(make_store(tmp_path / "store.zarr"))
    data = persistence_forecast(ds, ds.time.values[:16], [6], ["2m_temperature"]).load()
    noisy = data + np.random.default_rng(14).normal(0, 0.5, data["2m_temperature"].shape)
    return ds, data, noisy, channels(data, ["2m_temperature"])


def test_scorecard_uses_the_chosen_method(tmp_path):
    """The scorecard records its method, and its DM p-value and RMSE interval are the chosen method's own
    functions applied to the per-initialisation loss series (MSE for RMSE) of forecast and baseline."""
    from wxray.verify.forecasts import truth_at
    from wxray.verify.metrics import score_series
    from wxray.verify.scorecard import Model, build_scorecard

    ds, data, noisy, chans = _scorecard_inputs(tmp_path)
    lead = data.lead_time.values[0]
    truth = truth_at(ds["2m_temperature"], data.init_time.values, lead, "t").load().astype(np.float64)
    series = [score_series(m["2m_temperature"].sel(lead_time=lead).astype(np.float64), truth, None, (), None,
                           False)[0] for m in (data, noisy)]
    mse_f, mse_b = series[0]["mse"], series[1]["mse"]
    n = mse_f.size
    cards = {m: build_scorecard(Model("f", data), ds, chans, baseline=Model("b", noisy), n_bootstrap=200, method=m)
             for m in ("fixed-b", "paper")}
    wilks = max(int(correlation_length(v)) for s in series for v in s.values())  # the paper's one shared length
    direct = {"fixed-b": diebold_mariano(mse_f, mse_b, method="fixed-b"),  # default bandwidth ceil(2 sqrt n)
              "paper": diebold_mariano(mse_f, mse_b, lag=wilks, method="paper")}
    assert float(direct["fixed-b"].p_value) != pytest.approx(float(direct["paper"].p_value), rel=1e-3)
    for method, card in cards.items():
        assert card.attrs["significance_method"] == method
        rmse = card.sel(metric="rmse").squeeze()
        assert int(rmse["block_length"]) == (hac_bandwidth(n) if method == "fixed-b" else wilks)
        assert float(rmse["dm_p_value"]) == pytest.approx(float(direct[method].p_value), rel=1e-12)
        assert float(rmse["dm_statistic"]) == pytest.approx(float(direct[method].statistic), rel=1e-12)
        assert float(rmse["significant"]) == float(float(rmse["dm_p_value"]) < 0.05)
        assert float(rmse["ci_lower"]) <= float(rmse["value"]) <= float(rmse["ci_upper"])
    ci = hac_interval([mse_f], lambda a: np.sqrt(a.mean(-1)))  # fixed-b: the jackknife-linearised t interval
    fixed = cards["fixed-b"].sel(metric="rmse").squeeze()
    assert float(fixed["ci_lower"]) == pytest.approx(float(ci.lower), rel=1e-12)
    assert float(fixed["ci_upper"]) == pytest.approx(float(ci.upper), rel=1e-12)
    np.testing.assert_allclose(cards["fixed-b"]["value"], cards["paper"]["value"])  # estimates: method-free
    with pytest.raises(DataError, match="one of fixed-b, paper"):
        build_scorecard(Model("f", data), ds, chans, method="wilks")


def test_n_bootstrap_and_seed_are_used_only_by_the_paper_method(tmp_path):
    from wxray.verify.scorecard import Model, build_scorecard

    ds, data, noisy, chans = _scorecard_inputs(tmp_path)

    def card(method, n_bootstrap, seed):
        return build_scorecard(Model("f", data), ds, chans, baseline=Model("b", noisy), method=method,
                               n_bootstrap=n_bootstrap, seed=seed)

    xr.testing.assert_identical(card("fixed-b", 200, 0), card("fixed-b", 1000, 3))
    a, b = card("paper", 200, 0), card("paper", 1000, 3)
    xr.testing.assert_identical(a["value"], b["value"])
    assert not np.allclose(a["ci_lower"].sel(metric="rmse"), b["ci_lower"].sel(metric="rmse"))


def test_fixed_b_needs_six_initialisations_and_gives_sane_intervals_from_there(tmp_path):
    """n = 4-5: no estimate of the autocorrelation holds the level (module docstring), so the scorecard
    gives the scores without intervals or tests there (has_intervals 0). From n = 6 the intervals are of the
    order of the standard error, not the ~100-400x a capped rho gave."""
    from tests.verify.conftest import make_store
    from wxray.data.schema import channels, open_store
    from wxray.verify.forecasts import persistence_forecast
    from wxray.verify.scorecard import Model, build_scorecard

    ds = open_store(make_store(tmp_path / "store.zarr"))
    chans = channels(ds, ["2m_temperature"])
    for n in (4, 5):
        data = persistence_forecast(ds, ds.time.values[:n], [6], ["2m_temperature"])
        short = build_scorecard(Model("f", data), ds, chans)
        assert short.attrs["intervals"] == "none" and int(short["has_intervals"].max()) == 0
        assert bool(short["ci_upper"].isnull().all()) and bool(short["value"].sel(metric="rmse").notnull().all())
    n = 6
    card = build_scorecard(Model("f", persistence_forecast(ds, ds.time.values[:n], [6], ["2m_temperature"])),
                           ds, chans)
    assert int(card["n_init"].squeeze()) == n and np.isfinite(card["ci_upper"].sel(metric="rmse")).all()
    assert card.attrs["intervals"] == "all"
    d = np.random.default_rng(15).standard_normal((4000, n))  # white noise: the mean's standard error 1/sqrt(n)
    ci = hac_interval([d], lambda a: a.mean(-1))
    c = fixed_b_critical_value(hac_bandwidth(n) / (n - 1))
    # The half-width is c sqrt(V/n) with V estimating 1: its median below 2 c / sqrt(n) means V's median is
    # below 4 (a capped rho = 0.97 multiplies V by ~1/0.03^2).
    assert float(np.median((ci.upper - ci.lower) / 2)) < 2 * c / np.sqrt(n)
