"""jobs/evaluate.py end to end: scorecard, plots, MLflow and RESULT on persistence, a nested ensemble and
the real ERA5 members; every bad input is a one-line error with exit status 2 and no output left."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from tests.fixture_files import ERA5_CORRUPTED, ERAINT
from tests.verify.conftest import ERA5_MEMBERS, make_store, nested_forecast, run_evaluate, write_zarr
from wxray.data.schema import open_store
from wxray.job import run_job
from wxray.verify import crps_fair, persistence_forecast, rmse, truth_at
from wxray.verify.evaluate import EvaluateConfig, evaluate

ROOT = Path(__file__).resolve().parents[2]
CHANNELS = ("geopotential_500", "geopotential_850", "2m_temperature")


@pytest.fixture(scope="module")
def store_path(tmp_path_factory) -> Path:
    return make_store(tmp_path_factory.mktemp("store") / "store.zarr")


def _persistence(store_path: Path, tmp_path: Path, n_init: int = 16, leads=(6, 24)) -> str:
    ds = open_store(store_path)
    return write_zarr(persistence_forecast(ds, ds.time.values[:n_init], list(leads)), tmp_path / "persistence.zarr")


def test_persistence_scorecard_plots_mlflow_and_result(store_path, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # MLflow's default artifact root (./mlruns) is relative to the cwd
    forecast = _persistence(store_path, tmp_path)
    out_dir = tmp_path / "run"
    uri = f"sqlite:///{tmp_path}/mlflow.db"
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

    from mlflow.tracking import MlflowClient

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


def _coarse(ds):
    return ds.isel(latitude=slice(None, None, 2), longitude=slice(None, None, 2))


def _one_member(ds):
    return ds.expand_dims(member=1, axis=2)


def _nested(m, n):
    def make(ds):
        return ds.expand_dims(encoder_draw=m, dropout_draw=n).transpose("init_time", "lead_time", ...) + 0.0
    return make


def _with_nan(ds):
    ds = ds.load()
    ds["2m_temperature"][2, 1, 3, 4] = np.nan
    return ds


def _all_inf(ds):
    return ds.load().assign(geopotential=ds.geopotential * 0 + np.inf)


BAD_FORECASTS = [
    (_coarse, [], "grid 8x16 differs from the truth grid 16x32 (set regrid=true"),
    (_one_member, [], "member dim 'member' has 1 entries; need at least 2 members"),
    (_nested(1, 3), [], "need at least 2 groups for the ANOVA split"),
    (_nested(3, 1), [], "need at least 2 replicates for the ANOVA split"),
    (_with_nan, [], "'2m_temperature' lead 24 h: 1 missing (NaN) or infinite values in forecast or truth "
     "(set skipna=true"),
    (_all_inf, [], "'geopotential_500' lead 6 h: 6144 missing (NaN) or infinite values"),
    (_all_inf, ["skipna=true"], "geopotential_500"),  # nothing left to score: named, not dropped
    (lambda ds: ds, ["variables=[vorticity]"], "variable 'vorticity' not found"),
    (lambda ds: ds, ["n_bootstrap=10"], "config key 'n_bootstrap' must be >= 100, got 10"),
    (lambda ds: ds, ["truth_member=first"], "config key 'truth_member'"),
    (lambda ds: ds, ["region=atlantis"], "config key 'region' expects one of 'global', 'tropics', 'extratropics', "
     "'northern_extratropics', 'southern_extratropics', 'europe', 'north_america', got 'atlantis'"),
]


@pytest.mark.parametrize("change, extra, message", BAD_FORECASTS)
def test_bad_input_is_a_one_line_error_and_leaves_nothing(store_path, tmp_path, capsys, change, extra, message):
    ds = open_store(store_path)
    fc = persistence_forecast(ds, ds.time.values[:12], [6, 24])
    forecast = write_zarr(change(fc), tmp_path / "bad.zarr")
    out_dir = tmp_path / "run"
    rc, result, err = run_evaluate([f"forecast={forecast}", f"truth={store_path}", f"out_dir={out_dir}",
                            "tracking.enabled=false", "n_bootstrap=100", *extra], capsys)
    assert rc == 2 and result is None
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], err
    assert not out_dir.exists()


def test_lead_without_truth_and_missing_forecast(store_path, tmp_path, capsys):
    ds = open_store(store_path)
    late = write_zarr(persistence_forecast(ds, ds.time.values[-8:], [24]), tmp_path / "late.zarr")
    rc, _, err = run_evaluate([f"forecast={late}", f"truth={store_path}", f"out_dir={tmp_path / 'a'}",
                       "tracking.enabled=false"], capsys)
    assert rc == 2 and "no truth at lead 24 h for 4 of 8 initialisations" in err and late in err
    rc, _, err = run_evaluate([f"forecast={tmp_path / 'nope.zarr'}", f"truth={store_path}", f"out_dir={tmp_path / 'b'}",
                       "tracking.enabled=false"], capsys)
    assert rc == 2 and f"error: forecast {tmp_path / 'nope.zarr'} does not exist" in err
    forecast = _persistence(store_path, tmp_path, n_init=8, leads=(6,))
    rc, _, err = run_evaluate([f"forecast={forecast}", f"truth={store_path}", f"baseline={tmp_path / 'gone.zarr'}",
                       f"out_dir={tmp_path / 'c'}", "tracking.enabled=false"], capsys)
    assert rc == 2 and err.strip() == f"error: baseline {tmp_path / 'gone.zarr'} does not exist", err
    assert not any((tmp_path / d).exists() for d in ("a", "b", "c"))


@pytest.mark.parametrize("role", ["truth", "forecast"])
def test_corrupted_grib_is_the_data_pipelines_one_line_error(store_path, tmp_path, capsys, role):
    """The same reader as prepare_data (wxray.data.sources): a truncated GRIB file is reported as corrupt,
    not as a cfgrib traceback or a missing 'time' dimension."""
    from wxray.data.sources import check_grib
    from wxray.errors import DataError

    with pytest.raises(DataError) as e:
        check_grib(str(ERA5_CORRUPTED))
    assert "corrupt or truncated GRIB file" in str(e.value)
    other = {"truth": f"forecast={_persistence(store_path, tmp_path, n_init=8, leads=(6,))}",
             "forecast": f"truth={store_path}"}[role]
    out_dir = tmp_path / "run"
    rc, result, err = run_evaluate([f"{role}={ERA5_CORRUPTED}", other, f"out_dir={out_dir}", "tracking.enabled=false"],
                           capsys)
    lines = err.strip().splitlines()
    assert rc == 2 and result is None and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0] == f"error: {role} {e.value}"
    assert not out_dir.exists()


def test_corrupted_grib_truth_through_the_script(store_path, tmp_path):
    forecast = _persistence(store_path, tmp_path, n_init=8, leads=(6,))
    out_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, str(ROOT / "jobs" / "evaluate.py"), f"forecast={forecast}",
                           f"truth={ERA5_CORRUPTED}", f"out_dir={out_dir}", "tracking.enabled=false"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"error: truth {ERA5_CORRUPTED}: corrupt or truncated GRIB file")
    assert not out_dir.exists()


def test_levels_on_a_forecast_without_levels_is_an_error(store_path, tmp_path, capsys):
    ds = open_store(store_path)
    surface = write_zarr(persistence_forecast(ds, ds.time.values[:8], [6], ["2m_temperature"]), tmp_path / "s.zarr")
    rc, result, err = run_evaluate([f"forecast={surface}", f"truth={store_path}", "levels=[500]",
                            f"out_dir={tmp_path / 'a'}", "tracking.enabled=false"], capsys)
    lines = err.strip().splitlines()
    assert rc == 2 and result is None and len(lines) == 1, err
    assert lines[0] == (f"error: forecast {surface}: levels=[500] asked for but no requested variable has "
                        "pressure levels (with levels: none; without: 2m_temperature)")
    both = _persistence(store_path, tmp_path, n_init=8, leads=(6,))
    rc, result, err = run_evaluate([f"forecast={both}", f"truth={store_path}", "levels=[500]",
                                    "variables=[2m_temperature]", f"out_dir={tmp_path / 'b'}",
                                    "tracking.enabled=false"], capsys)
    assert rc == 2 and "(with levels: geopotential; without: 2m_temperature)" in err, err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_regrid_and_skipna_recover(store_path, tmp_path, capsys):
    ds = open_store(store_path)
    fc = persistence_forecast(ds, ds.time.values[:12], [6, 24])
    coarse = write_zarr(_coarse(fc), tmp_path / "coarse.zarr")
    rc, result, err = run_evaluate([f"forecast={coarse}", f"truth={store_path}", "regrid=true", "plots=false",
                            f"out_dir={tmp_path / 'a'}", "tracking.enabled=false", "n_bootstrap=100"], capsys)
    assert rc == 0, err
    assert np.isfinite(result["rmse.geopotential_500.24h"])
    holes = write_zarr(_with_nan(fc), tmp_path / "holes.zarr")
    rc, result, err = run_evaluate([f"forecast={holes}", f"truth={store_path}", "skipna=true", "plots=false",
                            f"out_dir={tmp_path / 'b'}", "tracking.enabled=false", "n_bootstrap=100"], capsys)
    assert rc == 0, err
    assert result["nan_points"] == 1 and np.isfinite(result["rmse.2m_temperature.24h"])
    card = xr.open_dataset(tmp_path / "b" / "scorecard.nc")
    assert int(card["nan_points"].sel(channel="2m_temperature")) == 1


def test_a_variable_one_side_lacks_is_named(store_path, tmp_path, capsys):
    """A forecast whose geopotential is stored as `z500`: scored without it, and the warning and RESULT say so."""
    ds = open_store(store_path)
    fc = persistence_forecast(ds, ds.time.values[:12], [6, 24]).rename_vars({"geopotential": "geopot"})
    forecast = write_zarr(fc, tmp_path / "renamed.zarr")
    rc = run_job("evaluate", EvaluateConfig, evaluate, [f"forecast={forecast}", f"truth={store_path}", "plots=false",
                                                        f"out_dir={tmp_path / 'a'}", "tracking.enabled=false",
                                                        "n_bootstrap=100"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert f"wxray: warning: not scored, only in the forecast {forecast}: geopot" in out
    assert f"wxray: warning: not scored, only in truth {store_path}: geopotential" in out
    result = json.loads(out.strip().splitlines()[-1].removeprefix("RESULT "))
    assert result["unscored"] == {"forecast_only": ["geopot"], "truth_only": ["geopotential"]}
    assert not any(k.startswith("rmse.geopotential") for k in result) and "rmse.2m_temperature.6h" in result


@pytest.mark.parametrize("damage", ["truncate", "scramble"])
def test_a_corrupt_chunk_is_one_line_naming_store_variable_and_chunk(store_path, tmp_path, capsys, damage):
    ds = open_store(store_path)
    forecast = write_zarr(persistence_forecast(ds, ds.time.values[:12], [6, 24]), tmp_path / "fc.zarr")
    chunk = sorted(p for p in (Path(forecast) / "2m_temperature" / "c").rglob("*") if p.is_file())[-1]
    raw = chunk.read_bytes()
    chunk.write_bytes(raw[: len(raw) // 2] if damage == "truncate" else raw[:8] + bytes(len(raw) - 8))
    rc, result, err = run_evaluate([f"forecast={forecast}", f"truth={store_path}", f"out_dir={tmp_path / 'run'}",
                                    "tracking.enabled=false", "n_bootstrap=100", "plots=false"], capsys)
    lines = err.strip().splitlines()
    key = chunk.relative_to(Path(forecast) / "2m_temperature" / "c").as_posix()
    assert rc == 2 and result is None and len(lines) == 1, err
    assert lines[0].startswith(f"error: store {forecast}: variable '2m_temperature', chunk c/{key} is corrupt or "
                               "truncated ("), lines[0]
    assert not (tmp_path / "run").exists()


def test_a_truncated_netcdf_truth_says_so(store_path, tmp_path, capsys):
    cut = tmp_path / "cut.nc"
    cut.write_bytes(ERAINT.read_bytes()[:2_000_000])
    forecast = _persistence(store_path, tmp_path, n_init=8, leads=(6,))
    rc, _, err = run_evaluate([f"forecast={forecast}", f"truth={cut}", f"out_dir={tmp_path / 'a'}",
                               "tracking.enabled=false"], capsys)
    assert rc == 2 and err.strip().startswith(f"error: truth {cut}: the NetCDF file is truncated or corrupt"), err


def test_make_persistence_option(store_path, tmp_path, capsys):
    rc, result, err = run_evaluate([f"truth={store_path}", "make_persistence=true", "leads=[6,12]", "plots=false",
                            f"out_dir={tmp_path / 'a'}", "tracking.enabled=false", "n_bootstrap=100",
                            "variables=[2m_temperature]"], capsys)
    assert rc == 0, err
    assert result["n_init"] == 24 - 2 and result["n_channels"] == 1
    assert result["crps.2m_temperature.12h"] > result["crps.2m_temperature.6h"]


def test_job_script_exits_non_zero_with_one_line_on_bad_input(store_path, tmp_path):
    ds = open_store(store_path)
    forecast = write_zarr(_coarse(persistence_forecast(ds, ds.time.values[:12], [6])), tmp_path / "coarse.zarr")
    out_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, str(ROOT / "jobs" / "evaluate.py"), f"forecast={forecast}",
                           f"truth={store_path}", f"out_dir={out_dir}", "tracking.enabled=false"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: forecast {forecast}: grid 8x16"), proc.stderr
    assert "RESULT" not in proc.stdout and not out_dir.exists()


def test_shipped_config_loads_and_validates():
    from wxray.config import load_config
    from wxray.errors import ConfigError

    cfg = load_config(EvaluateConfig, ["--config", str(ROOT / "configs" / "evaluate.yaml"), "truth=s.zarr",
                                       "forecast=f.zarr", "variables=[geopotential]", "levels=[500]"])
    assert cfg.n_bootstrap == 5000 and cfg.variables == ["geopotential"] and cfg.levels == [500]
    with pytest.raises(ConfigError, match="exactly one of forecast"):
        load_config(EvaluateConfig, ["truth=s.zarr"])
    with pytest.raises(ConfigError, match="unknown config key 'bootstrap'"):
        load_config(EvaluateConfig, ["truth=s.zarr", "forecast=f.zarr", "bootstrap=3"])


def test_baseline_file_must_share_initialisations(store_path, tmp_path, capsys):
    ds = open_store(store_path)
    forecast = write_zarr(persistence_forecast(ds, ds.time.values[:12], [6]), tmp_path / "f.zarr")
    short = write_zarr(persistence_forecast(ds, ds.time.values[:8], [6]), tmp_path / "short.zarr")
    rc, _, err = run_evaluate([f"forecast={forecast}", f"truth={store_path}", f"baseline={short}",
                       f"out_dir={tmp_path / 'a'}", "tracking.enabled=false"], capsys)
    assert rc == 2 and f"baseline {short}: lacks 4 of the forecast's init_time values" in err
    rc, result, err = run_evaluate([f"forecast={forecast}", f"truth={store_path}", f"baseline={forecast}",
                                    "plots=false", f"out_dir={tmp_path / 'b'}", "tracking.enabled=false",
                                    "n_bootstrap=100"], capsys)
    assert rc == 0, err
    # A forecast compared with itself: zero difference, never significant.
    assert result["n_compared"] > 0 and result["n_significant_better"] == result["n_significant_worse"] == 0
    assert result["mean_rel_diff.rmse"] == 0.0


def test_a_baseline_on_fewer_points_than_the_forecast_is_refused(store_path, tmp_path, capsys):
    ds = open_store(store_path).load()
    fc = persistence_forecast(ds, ds.time.values[:12], [6])
    forecast = write_zarr(fc, tmp_path / "full.zarr")
    cropped = write_zarr(fc.isel(longitude=slice(2, -3)), tmp_path / "cropped.zarr")
    rc, result, err = run_evaluate([f"forecast={forecast}", f"truth={store_path}", f"baseline={cropped}",
                                    f"out_dir={tmp_path / 'r'}", "tracking.enabled=false"], capsys)
    assert rc == 2 and result is None
    assert f"baseline {cropped}: grid 16x27 differs from the forecast's 16x32" in err, err
    assert not (tmp_path / "r").exists()


def test_a_routing_level_is_a_third_branch_of_the_scorecard():
    """jobs/ensemble.py members.R > 1 writes a routing_draw dim: the scorecard splits it off as U_route (three
    levels), recovering known components of a calibrated synthetic nested ensemble, with a total spread-skill
    of 1 when each level is weighted by its own independent draws (M, M N, M N R)."""
    from wxray.verify.scorecard import metrics_for, score_series

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


@pytest.mark.parametrize("n_init, method", [(5, "fixed-b"), (3, "paper"), (1, "fixed-b")])
def test_too_few_inits_for_the_intervals_still_scores(store_path, tmp_path, capsys, n_init, method):
    """Fewer inits than the method's intervals need: the scores without intervals or significance, marked so
    in the scorecard, RESULT and plots, with one warning line."""
    import json

    from wxray.job import run_job
    from wxray.verify.evaluate import evaluate
    from wxray.verify.plots import no_intervals_note

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
