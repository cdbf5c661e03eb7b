"""Every bad input: one-line DataError/ConfigError naming file/variable, exit 2, no store left behind."""

from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
import pytest
import xarray as xr

import wxray.data.writer as writer
from tests.data.data_helpers import CORRUPTED, ERAINT, MEMBERS, MISSING_GRIB, ROOT, assert_failed_cleanly, synthetic
from wxray.data.schema import open_stats


def test_corrupted_grib_is_a_clean_error(run_prepare, tmp_path):
    out = tmp_path / "c.zarr"
    run = run_prepare(f"source={CORRUPTED}", f"out={out}")
    assert_failed_cleanly(run, out, str(CORRUPTED), "corrupt")


def test_corrupted_grib_through_the_script(tmp_path):
    """As users run it: a separate interpreter that must exit 2 with one line, no traceback."""
    out = tmp_path / "c.zarr"
    r = subprocess.run([sys.executable, "jobs/prepare_data.py", f"source={CORRUPTED}", f"out={out}",
                        f"out_dir={tmp_path / 'run'}", "tracking.enabled=false"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and str(CORRUPTED) in lines[0]
    assert not out.exists() and not (tmp_path / "run").exists()


def test_missing_variable(run_prepare, tmp_path):
    out = tmp_path / "v.zarr"
    run = run_prepare(f"source={MEMBERS}", f"out={out}", "member=0", "variables=[z,q]")
    assert_failed_cleanly(run, out, str(MEMBERS), "'specific_humidity' not found", "geopotential")


def test_missing_level(run_prepare, tmp_path):
    out = tmp_path / "l.zarr"
    run = run_prepare(f"source={MEMBERS}", f"out={out}", "member=0", "levels=[500,300]")
    assert_failed_cleanly(run, out, str(MEMBERS), "no level [300]", "'geopotential'")


def test_nan_rejected_after_blocks_were_written(run_prepare, tmp_path, monkeypatch):
    monkeypatch.setattr(writer, "BLOCK_BYTES", 1)  # one step per block: blocks 0..4 are on disk first
    src = synthetic(n_times=8)
    src["t"][5, 1, 2, 3] = np.nan
    path = tmp_path / "nan.nc"
    src.to_netcdf(path)
    out = tmp_path / "nan.zarr"
    run = run_prepare(f"source={path}", f"out={out}")
    assert_failed_cleanly(run, out, str(path), "'temperature'", "1 missing", "allow_missing=true",
                          "2020-01-02T06:00:00")


def test_nan_kept_with_allow_missing(run_prepare, tmp_path):
    src = synthetic(n_times=6)
    src["t2m"][1, 0, :] = np.nan  # a whole latitude row at one time: 8 values
    path = tmp_path / "nan.nc"
    src.to_netcdf(path)
    out = tmp_path / "nan.zarr"
    run = run_prepare(f"source={path}", f"out={out}", "allow_missing=true")
    assert run.rc == 0, run.err
    assert run.result["n_missing"] == 8
    assert run.result["missing_per_variable"] == {"geopotential": 0, "temperature": 0, "2m_temperature": 8}
    ds = xr.open_zarr(out, consolidated=False)
    assert ds.attrs["n_missing"] == 8 and ds.attrs["n_missing_per_variable"]["2m_temperature"] == 8
    got = ds["2m_temperature"].values
    assert np.isnan(got[1, -1, :]).all() and np.isnan(got).sum() == 8  # source lat 90 is the last row now
    mean = open_stats(out).mean["2m_temperature"].values
    np.testing.assert_allclose(mean, np.nanmean(src.t2m.values.astype(np.float64)), rtol=1e-6)


def test_grib_bitmap_missing_values(run_prepare, tmp_path):
    out = tmp_path / "bitmap.zarr"
    run = run_prepare(f"source={MISSING_GRIB}", f"out={out}")
    assert_failed_cleanly(run, out, str(MISSING_GRIB), "'2m_temperature'", "missing (NaN)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        n_nan = int(np.isnan(xr.open_dataset(MISSING_GRIB, engine="cfgrib",
                                             backend_kwargs={"indexpath": ""}).t2m.values).sum())
    assert n_nan > 0
    run = run_prepare(f"source={MISSING_GRIB}", f"out={out}", "allow_missing=true")
    assert run.rc == 0, run.err
    assert run.result["n_missing"] == n_nan and run.result["variables"] == ["2m_temperature"]
    assert int(np.isnan(xr.open_zarr(out, consolidated=False)["2m_temperature"].values).sum()) == n_nan


def test_non_monotonic_time_axis(run_prepare, tmp_path):
    src = synthetic(n_times=5)
    src = src.isel(time=[0, 1, 3, 2, 4])
    path = tmp_path / "shuffled.nc"
    src.to_netcdf(path)
    out = tmp_path / "t.zarr"
    run = run_prepare(f"source={path}", f"out={out}")
    assert_failed_cleanly(run, out, str(path), "strictly increasing", "2020-01-01T18:00:00 is followed by")


def test_duplicated_time_across_files(run_prepare, tmp_path):
    src = synthetic(n_times=6)
    src.isel(time=slice(0, 4)).to_netcdf(tmp_path / "a.nc")
    src.isel(time=slice(3, 6)).to_netcdf(tmp_path / "b.nc")  # overlaps a.nc at 2020-01-01T18
    out = tmp_path / "dup.zarr"
    run = run_prepare(f"source={tmp_path / '*.nc'}", f"out={out}")
    assert_failed_cleanly(run, out, "a.nc", "b.nc", "duplicated time 2020-01-01T18:00:00")


def test_source_that_does_not_exist(run_prepare, tmp_path):
    out = tmp_path / "x.zarr"
    missing = tmp_path / "nowhere" / "era5.grib"
    run = run_prepare(f"source={missing}", f"out={out}")
    assert_failed_cleanly(run, out, str(missing), "does not exist")
    run = run_prepare(f"source={tmp_path / 'nowhere' / '*.nc'}", f"out={out}")
    assert_failed_cleanly(run, out, "no file matches")


def test_member_asked_of_a_deterministic_source(run_prepare, tmp_path):
    out = tmp_path / "x.zarr"
    run = run_prepare(f"source={ERAINT}", f"out={out}", "member=0")
    assert_failed_cleanly(run, out, str(ERAINT), "no ensemble members")


@pytest.mark.parametrize("arg, needle", [
    ("bogus=1", "unknown config key 'bogus'"),
    ("clim_window_days=abc", "config key 'clim_window_days' expects int"),
    ("member=average", "config key 'member'"),
])
def test_bad_config(run_prepare, tmp_path, arg, needle):
    out = tmp_path / "x.zarr"
    run = run_prepare(f"source={MEMBERS}", f"out={out}", arg)
    assert_failed_cleanly(run, out, needle)


def test_levels_asked_of_data_without_levels_is_refused_alike(run_prepare, tmp_path):
    """levels=[500] on surface-only data: prepare_data (normalize.select) and training (schema.channels via
    make_spec, data.levels) refuse it with the same words, naming the source and what exists."""
    from wxray.data.schema import channels, open_store
    from wxray.data.windows import WindowConfig, make_spec
    from wxray.errors import DataError

    path = tmp_path / "surface.nc"
    synthetic(n_times=6)[["t2m"]].to_netcdf(path)
    out = tmp_path / "s.zarr"
    run = run_prepare(f"source={path}", f"out={out}", "levels=[500]")
    words = "levels=[500] asked for but no requested variable has pressure levels"
    assert_failed_cleanly(run, out, str(path), words)
    run = run_prepare(f"source={path}", f"out={out}")
    assert run.rc == 0, run.err
    with pytest.raises(DataError) as e:
        make_spec(str(out), open_store(out), open_stats(out), WindowConfig(levels=[500]))
    msg = str(e.value)
    assert msg.startswith(f"store {out}: {words}") and "(with levels: none; without: 2m_temperature)" in msg
    assert len(msg.splitlines()) == 1
    mixed = synthetic(n_times=2, short=False).rename(lat="latitude", lon="longitude")
    with pytest.raises(DataError, match=r"store x: levels=\[500\] asked .* \(with levels: geopotential, "
                                        r"temperature; without: 2m_temperature\)"):
        channels(mixed, ["2m_temperature"], [500], source="store x")
    assert [c.name for c in channels(mixed, ["2m_temperature", "temperature"], [500])] == [
        "2m_temperature", "temperature_500"]


@pytest.mark.parametrize("keep", [0.5, 0.9])
def test_a_truncated_netcdf_says_so(run_prepare, tmp_path, keep):
    """The netCDF library reads a cut-off classic file as fill values; the error must say truncated."""
    path = tmp_path / "cut.nc"
    raw = ERAINT.read_bytes()
    path.write_bytes(raw[: int(len(raw) * keep)])
    out = tmp_path / "cut.zarr"
    run = run_prepare(f"source={path}", f"out={out}")
    assert_failed_cleanly(run, out, str(path), "the NetCDF file is truncated or corrupt")


def test_infinite_values_are_not_called_missing(run_prepare, tmp_path):
    src = synthetic(n_times=4)
    src["t"][1, 0, 2, 3] = np.inf
    path = tmp_path / "inf.nc"
    src.to_netcdf(path)
    out = tmp_path / "inf.zarr"
    run = run_prepare(f"source={path}", f"out={out}")
    assert_failed_cleanly(run, out, str(path), "'temperature' has 1 infinite values")
