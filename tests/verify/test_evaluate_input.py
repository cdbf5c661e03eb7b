"""jobs/evaluate.py on bad input: every one is a one-line error naming the file and what was expected, exit
status 2 and nothing left behind; what can be recovered (regrid, skipna) is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from tests.fixture_files import ERA5_CORRUPTED, ERAINT
from tests.verify.conftest import persistence_file, run_evaluate, write_zarr
from wxray.config import load_config
from wxray.data.schema import open_store
from wxray.data.sources import check_grib
from wxray.errors import ConfigError, DataError
from wxray.job import run_job
from wxray.verify.evaluate import EvaluateConfig, evaluate
from wxray.verify.forecasts import persistence_forecast

ROOT = Path(__file__).resolve().parents[2]


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
    forecast = persistence_file(store_path, tmp_path, n_init=8, leads=(6,))
    rc, _, err = run_evaluate([f"forecast={forecast}", f"truth={store_path}", f"baseline={tmp_path / 'gone.zarr'}",
                       f"out_dir={tmp_path / 'c'}", "tracking.enabled=false"], capsys)
    assert rc == 2 and err.strip() == f"error: baseline {tmp_path / 'gone.zarr'} does not exist", err
    assert not any((tmp_path / d).exists() for d in ("a", "b", "c"))


@pytest.mark.parametrize("role", ["truth", "forecast"])
def test_corrupted_grib_is_the_data_pipelines_one_line_error(store_path, tmp_path, capsys, role):
    """The same reader as prepare_data (wxray.data.sources): a truncated GRIB file is reported as corrupt,
    not as a cfgrib traceback or a missing 'time' dimension."""
    with pytest.raises(DataError) as e:
        check_grib(str(ERA5_CORRUPTED))
    assert "corrupt or truncated GRIB file" in str(e.value)
    other = {"truth": f"forecast={persistence_file(store_path, tmp_path, n_init=8, leads=(6,))}",
             "forecast": f"truth={store_path}"}[role]
    out_dir = tmp_path / "run"
    rc, result, err = run_evaluate([f"{role}={ERA5_CORRUPTED}", other, f"out_dir={out_dir}", "tracking.enabled=false"],
                           capsys)
    lines = err.strip().splitlines()
    assert rc == 2 and result is None and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0] == f"error: {role} {e.value}"
    assert not out_dir.exists()


@pytest.mark.slow
def test_corrupted_grib_truth_through_the_script(store_path, tmp_path):
    forecast = persistence_file(store_path, tmp_path, n_init=8, leads=(6,))
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
    both = persistence_file(store_path, tmp_path, n_init=8, leads=(6,))
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
    forecast = persistence_file(store_path, tmp_path, n_init=8, leads=(6,))
    rc, _, err = run_evaluate([f"forecast={forecast}", f"truth={cut}", f"out_dir={tmp_path / 'a'}",
                               "tracking.enabled=false"], capsys)
    assert rc == 2 and err.strip().startswith(f"error: truth {cut}: the NetCDF file is truncated or corrupt"), err


@pytest.mark.slow
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
