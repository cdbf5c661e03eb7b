"""A new score is one class and one line in `verify.metrics.METRICS` (issue 53): added here to the registry, it
shows in the scorecard (with its baseline comparison), the plots, RESULT's headline, the digest, a rollout's
report and an inference sweep's trial report, because every caller picks by the registry's classes. And the
series several scores share are computed once per lead."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import wxray.verify.plots as plots
from tests.verify.conftest import nested_forecast
from wxray.data.schema import channels, open_store
from wxray.tune import calibration
from wxray.tune.results import collect
from wxray.verify import deterministic as det
from wxray.verify import ensemble as ens
from wxray.verify import metrics
from wxray.verify.digest import digest
from wxray.verify.ensemble_metrics import EnsembleMetric
from wxray.verify.evaluate import headline
from wxray.verify.forecasts import persistence_forecast, truth_at
from wxray.verify.lead_scores import score_per_lead
from wxray.verify.metric_base import Fields, MeanScore
from wxray.verify.scorecard import Model, build_scorecard, scorecard_table

LEADS = [6, 12, 24]


class LargestError(MeanScore):
    """A score the registry has never seen: the mean over inits of the largest absolute error of the mean."""

    name = "largest_error"
    label = "largest error"
    inputs = ("largest_error",)
    loss = "largest_error"
    unit_power = 1
    plot = True
    headline = 9
    key_comparison = True
    digest = 9
    sweep = 9
    rollout = True

    def series(self, f: Fields) -> dict[str, xr.DataArray]:
        return {"largest_error": abs(f.mean - f.truth).max(("latitude", "longitude"))}


class MemberRange(EnsembleMetric, MeanScore):
    """An ensemble-only score: the spatial mean of the members' range (largest - smallest)."""

    name = "member_range"
    label = "member range"
    inputs = ("member_range",)
    unit_power = 1

    def series(self, f: Fields) -> dict[str, xr.DataArray]:
        return {"member_range": f.spatial(f.forecast.max(f.member_dims) - f.forecast.min(f.member_dims))}


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setattr(metrics, "METRICS", (*metrics.METRICS, LargestError(), MemberRange()))  # the one line


@pytest.fixture(scope="module")
def inputs(store_path):
    ds = open_store(store_path)
    inits = ds.time.values[:12]
    fc = persistence_forecast(ds, inits, LEADS)
    rng = np.random.default_rng(7)
    noisy = fc + xr.Dataset({k: (v.dims, rng.normal(0, 1, v.shape) * (80 if k == "geopotential" else 0.4))
                             for k, v in fc.data_vars.items()})
    return ds, fc, noisy, channels(fc, ["2m_temperature", "geopotential"], [500])


def _largest_error(forecast: xr.Dataset, ds: xr.Dataset, lead_h: int) -> float:
    """Independent reference: numpy's largest |forecast - truth| per init, averaged over inits."""
    lead = np.timedelta64(lead_h, "h")
    f = forecast["2m_temperature"].sel(lead_time=lead)
    t = truth_at(ds["2m_temperature"], f.init_time.values, lead, "t")
    return float(np.abs(f.values - t.values).max(axis=(1, 2)).mean())


def test_a_new_score_is_shown_everywhere(registered, inputs, tmp_path):
    ds, fc, noisy, chans = inputs
    card = build_scorecard(Model("forecast", noisy), ds, chans, baseline=Model("baseline persistence", fc))
    card.attrs["n_members"] = 1
    assert list(card["metric"].values)[-1] == "largest_error"  # after every registered score, in the scorecard
    assert "member_range" not in card["metric"].values  # an ensemble score does not apply to one member
    value = card["value"].sel(channel="2m_temperature", metric="largest_error")
    np.testing.assert_allclose(value, [_largest_error(noisy, ds, h) for h in LEADS], rtol=1e-10)
    assert np.isfinite(card["dm_p_value"].sel(metric="largest_error")).all()  # its loss series is compared
    assert int(card["unit_power"].sel(metric="largest_error")) == 1
    assert "largest_error" in set(scorecard_table(card)["metric"])

    figures = dict(plots.figures(card))
    assert {"score_largest_error.png", "scorecard_largest_error.png"} <= figures.keys()
    assert plots.score_label("largest_error", "K") == "largest error [K]"

    result = headline(card)
    assert "largest_error.2m_temperature.24h" in result and "rel_diff.largest_error.geopotential_500.6h" in result
    assert list(result).index("crps.2m_temperature.6h") < list(result).index("largest_error.2m_temperature.6h")
    assert "mean_rel_diff.largest_error" in result
    assert digest(card)[0].startswith("LARGEST_ERROR at 6 h -> 24 h")  # it outranks RMSE in the digest

    csv = tmp_path / "scorecard.csv"
    scorecard_table(card).to_csv(csv, index=False)
    report = calibration.scorecard_metrics(csv)
    assert report["largest_error/2m_temperature"] == pytest.approx(
        float(value.mean()), rel=1e-5)  # mean over leads (all after lead 0)
    assert "largest_error/geopotential_500" in calibration.report_keys(["geopotential_500"])
    assert calibration.is_report_key("largest_error/geopotential_500")

    rollout = score_per_lead(noisy[["2m_temperature"]], ds)
    np.testing.assert_allclose(rollout["largest_error"]["2m_temperature"],
                               [_largest_error(noisy, ds, h) for h in LEADS], rtol=1e-10)


def test_a_new_ensemble_score_applies_to_ensembles_only(registered, store_path):
    ds = open_store(store_path)
    fc = nested_forecast(ds, ds.time.values[:8], [6], m=2, n=3)[["2m_temperature"]]
    card = build_scorecard(Model("nested", fc), ds, channels(fc, ["2m_temperature"]), intervals=False, maps=False)
    assert "member_range" in card["metric"].values
    f = fc["2m_temperature"].isel(lead_time=0)
    spread = f.max(("encoder_draw", "dropout_draw")) - f.min(("encoder_draw", "dropout_draw"))
    # the fixture's rows are centred in equal cells from pole to pole: cell-area weights sin(upper) - sin(lower)
    w = np.diff(np.sin(np.deg2rad(np.linspace(-90, 90, ds.sizes["latitude"] + 1))))[:, None]
    reference = float(((spread.values * w).mean(axis=2).sum(axis=1) / w.sum()).mean())
    np.testing.assert_allclose(float(card["value"].sel(metric="member_range").squeeze()), reference, rtol=1e-6)


def test_a_sweep_table_keeps_what_trials_report(registered):
    class Result:
        config = {"params": {}, "sweep_dir": "/sweep"}
        metrics = {"trial_id": "t1", "epoch": 1, "ssr_distance": 0.1, "largest_error/t2m": 3.0, "time_total_s": 9.0}
        error = None
        path = "/sweep/trials/t1"

    row = collect([Result()], [], "ssr_distance", 1).iloc[0]
    assert row["largest_error/t2m"] == 3.0 and "time_total_s" not in row


@pytest.mark.parametrize("design, sorts", [({"m": 2, "n": 3}, 2), ({"member": 6}, 1)])
def test_shared_series_are_computed_once_per_lead(store_path, monkeypatch, design, sorts):
    """The ensemble mean's MSE (RMSE and SSR) once, the members sorted once for fair and ECDF CRPS (twice for a
    nested ensemble's fair CRPS: within groups and over all pairs, which the ECDF CRPS reuses)."""
    ds = open_store(store_path)
    fc = nested_forecast(ds, ds.time.values[:8], [6], m=2, n=3)["2m_temperature"].isel(lead_time=0)
    fc = fc.astype(np.float64)
    if "member" in design:
        fc = ens.flatten_members(fc).transpose("init_time", "member", ...)
    truth = truth_at(ds["2m_temperature"], fc.init_time.values, np.timedelta64(6, "h"), "t").astype(np.float64)
    calls = {"mse": 0, "sort": 0}

    def counted(name, fn):
        def wrapper(*a, **k):
            calls[name] += 1
            return fn(*a, **k)
        return wrapper

    monkeypatch.setattr(det, "mse", counted("mse", det.mse))
    monkeypatch.setattr(ens, "_pairwise_abs_sum", counted("sort", ens._pairwise_abs_sum))
    member_dims = ens.member_dims_of(fc)
    series, maps, _ = metrics.score_series(fc, truth, None, member_dims, None, False)
    assert {"mse", "crps", "crps_ecdf"} <= series.keys() and "crps_map" in maps
    assert calls == {"mse": 1, "sort": sorts}
    ecdf = ens.crps_ecdf(ens.flatten_members(fc, member_dims) if len(member_dims) > 1 else fc, truth,
                         "member").values
    np.testing.assert_allclose(series["crps_ecdf"], ecdf, rtol=1e-12)  # the shared sort, the same score
