"""jobs/evaluate.py end to end: scorecard, plots, MLflow and RESULT on persistence, a nested ensemble and
the real ERA5 members, a routing level, too few inits for intervals. Bad input: test_evaluate_input.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from mlflow.tracking import MlflowClient

from tests.mlflow_db import fresh_uri
from tests.verify.conftest import ERA5_MEMBERS, nested_forecast, persistence_file, run_evaluate, write_zarr
from wxray.data.schema import open_store
from wxray.job import run_job
from wxray.verify.deterministic import rmse
from wxray.verify.ensemble import crps_fair
from wxray.verify.evaluate import EvaluateConfig, evaluate
from wxray.verify.forecasts import persistence_forecast, truth_at
from wxray.verify.metrics import metrics_for, score_series
from wxray.verify.plots import no_intervals_note

ROOT = Path(__file__).resolve().parents[2]
CHANNELS = ("geopotential_500", "geopotential_850", "2m_temperature")


@pytest.mark.slow
def test_persistence_scorecard_plots_mlflow_and_result(store_path, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # MLflow's default artifact root (./mlruns) is relative to the cwd
    forecast = persistence_file(store_path, tmp_path)
    out_dir = tmp_path / "run"
    uri = fresh_uri(tmp_path)
    rc, result, err = run_evaluate([f"forecast={forecast}", f"truth={store_path}", f"out_dir={out_dir}",
                            f"tracking.uri={uri}", "n_bootstrap=300"], capsys)
    assert rc == 0, err
    for name in ("scorecard.nc", "scorecard.csv", "summary.json", "plots/score_rmse.png", "plots/score_crps.png",
                 "plots/score_acc.png", "plots/maps_geopotential_500.png"):
        assert (out_dir / name).is_file(), name
    assert result["n_members"] == 1 and result["n_init"] == 16 and result["nan_points"] == 0
    for ch in CHANNELS:  # persistence loses skill with lead
        assert 0 < result[f"rmse.{ch}.6h"] < result[f"rmse.{ch}.24h"]
        assert 1 >= result[f"acc.{ch}.6h"] > result[f"acc.{ch}.24h"]
    card = xr.open_dataset(out_dir / "scorecard.nc").load()
    value = card["value"]
    # A deterministic forecast's CRPS is its absolute error: proper-score comparisons with ensembles.
    np.testing.assert_allclose(value.sel(metric="crps"), value.sel(metric="mae"), rtol=1e-12)
    assert bool((card["ci_lower"] <= value).all() & (value <= card["ci_upper"]).all())
    assert int(card["block_length"].min()) >= 1 and "rank_histogram" not in card
    # A one-member forecast's CRPS map is its MAE map, named so; units come from the store's attributes.
    assert "mae_map" in card and "crps_map" not in card and "spread_map" not in card
    assert dict(zip(card["channel"].values, card["units"].values)) == {
        "2m_temperature": "K", "geopotential_500": "m**2 s**-2", "geopotential_850": "m**2 s**-2"}
    assert result["units"]["geopotential_500"] == "m**2 s**-2"
    # The scorecard's RMSE is the independent library path: sqrt of the time-mean latitude-weighted MSE.
    ds = open_store(store_path)
    fc = xr.open_zarr(forecast, consolidated=False)
    lead = np.timedelta64(24, "h")
    t = truth_at(ds["2m_temperature"], fc.init_time.values, lead, "t2m").astype(np.float64)
    direct = float(rmse(fc["2m_temperature"].sel(lead_time=lead).astype(np.float64), t, time_dims=["init_time"]))
    assert float(value.sel(channel="2m_temperature", metric="rmse", lead_time=lead)) == pytest.approx(direct)
    table = pd.read_csv(out_dir / "scorecard.csv")
    assert {"channel", "lead_hours", "metric", "value", "ci_lower", "ci_upper", "n_init"} <= set(table.columns)
    assert len(table) == 3 * 2 * 6  # channels x leads x (rmse, bias, mae, acc, ssim, crps)
    units = table.groupby(["channel", "metric"])["units"].first().fillna("")
    assert units[("geopotential_500", "rmse")] == "m**2 s**-2" and units[("2m_temperature", "crps")] == "K"
    assert units[("geopotential_500", "acc")] == "" and units[("2m_temperature", "ssim")] == ""  # dimensionless
    levels = table.groupby("channel")["level"].first()
    assert levels["geopotential_500"] == 500 and pd.isna(levels["2m_temperature"])  # no level, not -1

    client = MlflowClient(tracking_uri=uri)
    run_id = result["mlflow_run_id"]
    # tracking.experiment is "": the job runner takes EvaluateConfig.experiment.
    assert client.get_experiment(client.get_run(run_id).info.experiment_id).name == "wxray-evaluate"
    history = client.get_metric_history(run_id, "rmse/geopotential_500")
    assert sorted(m.step for m in history) == [6, 24]
    artifacts = {a.path for a in client.list_artifacts(run_id)}
    assert {"scorecard.nc", "scorecard.csv", "plots", "summary.json"} <= artifacts
    assert any(a.path.endswith("score_rmse.png") for a in client.list_artifacts(run_id, "plots"))
    assert (tmp_path / "mlartifacts").is_dir()  # beside the sqlite store, not in ./mlruns


@pytest.mark.slow
def test_nested_ensemble_against_persistence_baseline(store_path, tmp_path, capsys):
    ds = open_store(store_path)
    inits = ds.time.values[:16]
    forecast = write_zarr(nested_forecast(ds, inits, [6, 24], m=3, n=4), tmp_path / "nested.zarr")
    out_dir = tmp_path / "run"
    rc, result, err = run_evaluate([f"forecast={forecast}", f"truth={store_path}", "baseline=persistence",
                            f"out_dir={out_dir}", "tracking.enabled=false", "n_bootstrap=300"], capsys)
    assert rc == 0, err
    assert result["n_members"] == 12 and result["n_significant_better"] > 0
    card = xr.open_dataset(out_dir / "scorecard.nc").load()
    v = card["value"]
    np.testing.assert_allclose(v.sel(metric="ssr_enc") ** 2 + v.sel(metric="ssr_drop") ** 2,
                               v.sel(metric="ssr_total") ** 2, rtol=1e-10)
    # sigma_b = 0.5, sigma_w = 1: the dropout share is 0.8; ~8000 points per lead, sampling sd ~0.01.
    np.testing.assert_allclose(v.sel(metric="rho_drop"), 0.8, atol=0.05)
    # Truth and members are exchangeable draws, but the encoder draw is shared by N members, so the
    # ensemble-mean error variance is sb^2 (1 + 1/M) + sw^2 (1 + 1/K), not (1 + 1/K)(sb^2 + sw^2).
    k, m, sb2, sw2 = 12, 3, 0.25, 1.0
    expected = np.sqrt((k + 1) / k) * np.sqrt((sb2 + sw2) / (sb2 * (1 + 1 / m) + sw2 * (1 + 1 / k)))
    np.testing.assert_allclose(v.sel(metric="ssr_total"), expected, atol=0.08)
    # The default (fixed-b) comparison: the ensemble beats persistence at 24 h in every channel, and a cell
    # is flagged exactly when its Diebold-Mariano p-value is below the level; with 16 strongly
    # autocorrelated initialisations some cells are not significant, and RESULT counts what is flagged.
    assert card.attrs["significance_method"] == "fixed-b"
    day = np.timedelta64(24, "h")
    compared = card["significant"].notnull()
    np.testing.assert_array_equal(card["significant"].where(compared, 0),
                                  (card["dm_p_value"] < 0.05).where(compared, False))
    for metric in ("rmse", "crps"):
        assert bool((card.sel(metric=metric, lead_time=day)["rel_diff"] < 0).all())
    better = (card["significant"] == 1) & xr.where(card["higher_is_better"] == 1, card["rel_diff"] > 0,
                                                   card["rel_diff"] < 0)
    assert result["n_significant_better"] == int(better.sum())
    # The paper's procedure (Wilks block bootstrap + HLN DM) on the same inputs finds every channel
    # significantly better at 24 h; it is liberal on short autocorrelated series, the default is more
    # conservative: no cell significant under fixed-b that is not under the paper method, and p-values
    # no smaller (see wxray/verify/inference.py for the measured sizes).
    rc, paper_result, err = run_evaluate([f"forecast={forecast}", f"truth={store_path}", "baseline=persistence",
                                  f"out_dir={tmp_path / 'paper'}", "tracking.enabled=false", "n_bootstrap=300",
                                  "significance_method=paper", "plots=false"], capsys)
    assert rc == 0, err
    paper = xr.open_dataset(tmp_path / "paper" / "scorecard.nc").load()
    np.testing.assert_allclose(paper["value"], card["value"], rtol=1e-12)  # same scores, other statistics
    for metric in ("rmse", "crps"):
        sel = paper.sel(metric=metric, lead_time=day)
        assert bool((sel["rel_diff"] < 0).all()) and bool((sel["significant"] == 1).all())
        assert bool((sel["rel_ci_upper"] < 0).all())
    assert not bool(((card["significant"] == 1) & (paper["significant"] == 0)).any())
    p_fixed, p_paper = card["dm_p_value"].values, paper["dm_p_value"].values
    assert np.all(p_fixed[np.isfinite(p_fixed)] >= p_paper[np.isfinite(p_fixed)])
    assert paper_result["n_significant_better"] >= result["n_significant_better"]
    hist = card["rank_histogram"]
    assert hist.sizes["rank"] == 13
    np.testing.assert_allclose(hist.sum("rank"), 1.0)
    for name in ("spread_skill.png", "rank_histogram.png", "score_crps.png", "maps_2m_temperature.png"):
        assert (out_dir / "plots" / name).is_file(), name


@pytest.mark.slow
def test_real_era5_members_against_held_out_member_and_their_mean(tmp_path, capsys):
    grib = str(ERA5_MEMBERS)
    # Member 0 of the ERA5 EDA is the unperturbed control; hold out a perturbed one. The file has 4 times:
    # too few for the fixed-b intervals (n >= 6), enough for the paper's bootstrap.
    rc, result, err = run_evaluate([f"forecast={grib}", f"truth={grib}", "truth_member=5", f"out_dir={tmp_path / 'a'}",
                            "tracking.enabled=false", "n_bootstrap=200", "plots=false",
                            "significance_method=paper"], capsys)
    assert rc == 0, err
    assert result["n_members"] == 9 and result["n_init"] == 4 and "acc.temperature_500.0h" not in result
    card = xr.open_dataset(tmp_path / "a" / "scorecard.nc").load()
    members = xr.open_dataset(grib, engine="cfgrib", backend_kwargs={"indexpath": ""})
    members = members.rename(number="member", isobaricInhPa="level").sortby("latitude").astype(np.float64)
    others = [i for i in range(10) if i != 5]
    direct = crps_fair(members["t"].isel(member=others), members["t"].isel(member=5), "member")
    ours = card["value"].sel(channel="temperature_850", metric="crps").item()
    assert ours == pytest.approx(float(direct.sel(level=850).mean("time")), rel=1e-10)
    # EDA members are exchangeable, so a held-out member looks like a draw from the ensemble: SSR ~ 1.
    ssr = card["value"].sel(metric="ssr").values
    assert np.all((ssr > 0.85) & (ssr < 1.15)), ssr
    rc, result, err = run_evaluate([f"forecast={grib}", f"truth={grib}", "truth_member=mean",
                                    f"out_dir={tmp_path / 'b'}", "tracking.enabled=false", "n_bootstrap=200",
                                    "plots=false", "significance_method=paper"], capsys)
    assert rc == 0, err
    assert result["n_members"] == 10
    for ch in ("geopotential_500", "temperature_850"):  # the ensemble mean has no error against itself
        assert result[f"rmse.{ch}.0h"] < 1e-6 * result[f"crps.{ch}.0h"]


def test_make_persistence_option(store_path, tmp_path, capsys):
    rc, result, err = run_evaluate([f"truth={store_path}", "make_persistence=true", "leads=[6,12]", "plots=false",
                            f"out_dir={tmp_path / 'a'}", "tracking.enabled=false", "n_bootstrap=100",
                            "variables=[2m_temperature]"], capsys)
    assert rc == 0, err
    assert result["n_init"] == 24 - 2 and result["n_channels"] == 1
    assert result["crps.2m_temperature.12h"] > result["crps.2m_temperature.6h"]


def test_a_routing_level_is_a_third_branch_of_the_scorecard():
    """jobs/ensemble.py members.R > 1 writes a routing_draw dim: the scorecard splits it off as U_route (three
    levels), recovering known components of a calibrated synthetic nested ensemble, with a total spread-skill
    of 1 when each level is weighted by its own independent draws (M, M N, M N R)."""
    rng = np.random.default_rng(5)
    m, n, r, inits, s2 = 3, 4, 2, 24, (0.5, 0.3, 0.2)
    grid = {"latitude": np.linspace(-80, 80, 32), "longitude": np.arange(64) * 5.625}
    shape = (inits, 32, 64)
    a = rng.normal(0, np.sqrt(s2[0]), (m + 1, *shape))
    b = rng.normal(0, np.sqrt(s2[1]), (m + 1, n, *shape))
    e = rng.normal(0, np.sqrt(s2[2]), (m + 1, n, r, *shape))
    y = a[:, None, None] + b[:, :, None] + e  # (M + 1, N, R, init, lat, lon); the last group is the truth
    coords = {"init_time": pd.date_range("2020-01-01", periods=inits, freq="6h"), **grid}
    dims = ("encoder_draw", "dropout_draw", "routing_draw", "init_time", *grid)
    forecast = xr.DataArray(y[:m], dims=dims, coords=coords, name="t")
    truth = xr.DataArray(y[m, 0, 0], dims=dims[3:], coords=coords, name="t")
    member_dims = ("encoder_draw", "dropout_draw", "routing_draw")
    series, *_ = score_series(forecast, truth, None, member_dims, None, False)
    for u, expected in zip(("u_enc", "u_drop", "u_route"), s2, strict=True):
        np.testing.assert_allclose(series[u].mean(), expected, rtol=0.05, err_msg=u)  # folded: U_enc +9%
    metrics = {k.name: k for k in metrics_for(m * n * r, (m, m * n, m * n * r), False)}
    assert {"u_route", "rho_route", "ssr_route"} <= metrics.keys()
    ratio = metrics["ssr_total"].aggregate(*(series[k] for k in metrics["ssr_total"].inputs))
    np.testing.assert_allclose(ratio, 1.0, atol=0.03)  # the mean's error carries sum_c U_c (1 + 1/draws_c)
    branches = [metrics[k].aggregate(*(series[i] for i in metrics[k].inputs)) for k in ("ssr_enc", "ssr_drop",
                                                                                       "ssr_route")]
    np.testing.assert_allclose(sum(v**2 for v in branches), ratio**2, rtol=1e-10)
    # the nested CRPS and the mean's error do not depend on how the inner levels are read
    folded = forecast.stack(d=("dropout_draw", "routing_draw")).drop_vars(["d", "dropout_draw", "routing_draw"])
    two, *_ = score_series(folded.rename(d="dropout_draw"), truth, None, member_dims[:2], None, False)
    for key in ("crps", "mse"):
        np.testing.assert_allclose(series[key], two[key], rtol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("n_init, method", [(5, "fixed-b"), (3, "paper"), (1, "fixed-b")])
def test_too_few_inits_for_the_intervals_still_scores(store_path, tmp_path, capsys, n_init, method):
    """Fewer inits than the method's intervals need: the scores without intervals or significance, marked so
    in the scorecard, RESULT and plots, with one warning line."""
    ds = open_store(store_path)
    fc = persistence_forecast(ds, ds.time.values[1: 1 + n_init], [6, 24])
    forecast = write_zarr(fc, tmp_path / "few.zarr")
    out_dir = tmp_path / "run"
    rc = run_job("evaluate", EvaluateConfig, evaluate, argv=[
        f"forecast={forecast}", f"truth={store_path}", f"out_dir={out_dir}", "tracking.enabled=false",
        "baseline=persistence", "n_bootstrap=100", f"significance_method={method}"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    warnings = [ln for ln in out.splitlines() if "warning" in ln]
    assert len(warnings) == 1 and f"{n_init} initialisation(s) are too few" in warnings[0], out
    result = json.loads(out.splitlines()[-1][len("RESULT "):])
    assert result["intervals"] == "none" and result["n_init"] == n_init
    assert result["n_compared"] == 0 and result["n_significant_better"] == 0
    lead = np.timedelta64(24, "h")
    direct = rmse(fc["2m_temperature"].sel(lead_time=lead), truth_at(ds["2m_temperature"], fc.init_time.values,
                                                                    lead, "truth"), time_dims=("init_time",))
    assert result["rmse.2m_temperature.24h"] == pytest.approx(float(direct), rel=1e-6)
    assert result["rel_diff.rmse.2m_temperature.24h"] == pytest.approx(0.0, abs=1e-12)  # persistence vs itself
    card = xr.open_dataset(out_dir / "scorecard.nc").load()
    assert card.attrs["intervals"] == "none" and int(card["has_intervals"].max()) == 0
    assert bool(card["ci_lower"].isnull().all()) and bool(card["significant"].isnull().all())
    assert bool(card["value"].sel(metric="rmse").notnull().all())
    assert (out_dir / "plots" / "score_rmse.png").is_file()
    assert f"{n_init} initialisation(s) are too few for the {method} method" in no_intervals_note(card)
