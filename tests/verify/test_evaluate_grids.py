"""jobs/evaluate.py on grids in other orientations: the same scores whatever the latitude order and the
longitude convention of truth, forecast and baseline; a regional truth crossing the prime meridian."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from tests.verify.conftest import make_store, run_evaluate, write_zarr
from tests.verify.test_forecast_grids import flip, write_raw_store
from wxray.data.schema import open_store
from wxray.verify.forecasts import persistence_forecast

SCORES = ("value", "n_init", "nan_points")


@pytest.fixture(scope="module")
def canonical(tmp_path_factory) -> Path:
    return make_store(tmp_path_factory.mktemp("grids") / "store.zarr")


def _card(argv: list[str], out_dir: Path, capsys) -> xr.Dataset:
    rc, result, err = run_evaluate([*argv, f"out_dir={out_dir}", "tracking.enabled=false", "n_bootstrap=100",
                            "plots=false"], capsys)
    assert rc == 0, err
    return xr.open_dataset(out_dir / "scorecard.nc").load()


def _same_scores(a: xr.Dataset, b: xr.Dataset, metrics=None) -> None:
    for k in SCORES:
        x, y = a[k], b[k]
        if metrics is not None and "metric" in x.dims:
            x, y = x.sel(metric=list(metrics)), y.sel(metric=list(metrics))
        np.testing.assert_allclose(x.values, y.values, rtol=1e-9, atol=1e-12, err_msg=k)


def test_truth_store_and_file_north_to_south_in_minus_180_score_the_same(canonical, tmp_path, capsys):
    ds = open_store(canonical).load()
    forecast = write_zarr(persistence_forecast(ds, ds.time.values[:12], [6, 24]), tmp_path / "f.zarr")
    want = _card([f"forecast={forecast}", f"truth={canonical}"], tmp_path / "a", capsys)
    raw = write_raw_store(flip(ds), tmp_path / "raw.zarr")  # with its stats groups, N->S too
    got = _card([f"forecast={forecast}", f"truth={raw}"], tmp_path / "b", capsys)
    assert "acc" in got.metric.values
    _same_scores(got, want)
    flip(ds).to_netcdf(tmp_path / "truth.nc")  # a file has no climatology: no ACC, the rest the same
    got = _card([f"forecast={forecast}", f"truth={tmp_path / 'truth.nc'}"], tmp_path / "c", capsys)
    _same_scores(got, want, [m for m in want.metric.values if m != "acc"])


@pytest.mark.slow
def test_forecast_and_baseline_north_to_south_in_minus_180_score_the_same(canonical, tmp_path, capsys):
    ds = open_store(canonical)
    fc = persistence_forecast(ds, ds.time.values[:12], [6, 24])
    base = persistence_forecast(ds, ds.time.values[2:14], [6, 24]).assign_coords(init_time=fc.init_time)
    f, b = write_zarr(fc, tmp_path / "f.zarr"), write_zarr(base, tmp_path / "b.zarr")
    f_flip, b_flip = write_zarr(flip(fc), tmp_path / "ff.zarr"), write_zarr(flip(base), tmp_path / "bf.zarr")
    want = _card([f"forecast={f}", f"truth={canonical}", f"baseline={b}"], tmp_path / "a", capsys)
    got = _card([f"forecast={f_flip}", f"truth={canonical}", f"baseline={b_flip}"], tmp_path / "b", capsys)
    _same_scores(got, want)
    np.testing.assert_allclose(got["rel_diff"].values, want["rel_diff"].values, rtol=1e-9)


def test_a_genuinely_different_grid_is_still_a_one_line_error(canonical, tmp_path, capsys):
    ds = open_store(canonical)
    fc = persistence_forecast(ds, ds.time.values[:12], [6])
    shifted = write_zarr(flip(fc).assign_coords(longitude=flip(fc).longitude + 1.0), tmp_path / "shift.zarr")
    rc, result, err = run_evaluate([f"forecast={shifted}", f"truth={canonical}", f"out_dir={tmp_path / 'a'}",
                            "tracking.enabled=false"], capsys)
    lines = err.strip().splitlines()
    assert rc == 2 and result is None and len(lines) == 1, err
    assert lines[0].startswith(f"error: forecast {shifted}: grid 16x32 differs from the truth grid 16x32")
    assert "longitude 1..349.75 vs the truth's latitude -84.375..84.375, longitude 0..348.75" in lines[0]
    assert not (tmp_path / "a").exists()


def test_regional_truth_crossing_greenwich_scores_like_the_global_one(canonical, tmp_path, capsys):
    """A box 45 W..45 E, 28 N..84 N cut from the global store, written in (-180, 180] with its own stats;
    the forecast on the same box given in [0, 360). Over Europe (inside the box) every score but SSIM
    (whose window sees the box's edges) equals the global evaluation's."""
    ds = open_store(canonical).load()
    box = ds.sel(latitude=slice(20, 90)).assign_coords(longitude=((ds.longitude + 180) % 360) - 180)
    box = box.sortby("longitude").sel(longitude=slice(-46, 46))
    assert box.longitude.values[0] == -45 and box.longitude.values[-1] == 45
    truth = write_raw_store(box, tmp_path / "box.zarr")
    fc_box = persistence_forecast(ds, ds.time.values[:12], [6, 24]).sel(latitude=slice(20, 90))
    fc_box = fc_box.sel(longitude=[lon for lon in ds.longitude.values if lon <= 46 or lon >= 314])
    f_box = write_zarr(fc_box, tmp_path / "fbox.zarr")  # 0..45 then 315..348.75: the box in [0, 360)
    f_all = write_zarr(persistence_forecast(ds, ds.time.values[:12], [6, 24]), tmp_path / "fall.zarr")
    want = _card([f"forecast={f_all}", f"truth={canonical}", "region=europe"], tmp_path / "a", capsys)
    got = _card([f"forecast={f_box}", f"truth={truth}", "region=europe"], tmp_path / "b", capsys)
    metrics = [m for m in want.metric.values if m != "ssim"]
    assert "acc" in metrics
    _same_scores(got, want, metrics)
    whole = _card([f"forecast={f_box}", f"truth={truth}"], tmp_path / "c", capsys)  # the whole box
    assert np.isfinite(whole["value"].values).all()


@pytest.mark.slow
def test_cropped_forecast_is_scored_on_its_truth_points(canonical, tmp_path, capsys):
    """A forecast on a block of the truth grid (a model grid cropped to fit its patches: here the southmost
    row and three columns dropped) is scored on those truth points, not refused and not interpolated: the
    same scores as against a truth cut to that block. A baseline on the full grid is cut to it too."""
    ds = open_store(canonical).load()
    crop = {"latitude": slice(1, None), "longitude": slice(1, -2)}
    fc = persistence_forecast(ds, ds.time.values[:12], [6, 24])
    cropped = fc.isel(crop) + 0.01 * fc.isel(crop).latitude  # not persistence itself: a nonzero difference
    f_crop = write_zarr(cropped, tmp_path / "crop.zarr")
    b_full = write_zarr(persistence_forecast(ds, ds.time.values[2:14], [6, 24]).assign_coords(init_time=fc.init_time),
                    tmp_path / "base.zarr")
    truth_crop = write_raw_store(ds.isel(crop), tmp_path / "truth_crop.zarr")  # stats of the block, same climatology
    for baseline in ("persistence", b_full):
        argv = [f"forecast={f_crop}", f"baseline={baseline}"]
        got = _card([*argv, f"truth={canonical}"], tmp_path / "a", capsys)
        want = _card([*argv, f"truth={truth_crop}"], tmp_path / "b", capsys)
        assert "acc" in got.metric.values and got.sizes["latitude"] == 15 and got.sizes["longitude"] == 29
        _same_scores(got, want)
        np.testing.assert_allclose(got["rel_diff"].values, want["rel_diff"].values, rtol=1e-9)
        np.testing.assert_array_equal(got.latitude.values, ds.latitude.values[1:])
        for d in ("a", "b"):
            shutil.rmtree(tmp_path / d)
    # Every other point is a coarser grid, not a crop: still an error without regrid=true.
    coarse = write_zarr(fc.isel(latitude=slice(None, None, 2)), tmp_path / "coarse.zarr")
    rc, result, err = run_evaluate([f"forecast={coarse}", f"truth={canonical}", f"out_dir={tmp_path / 'c'}",
                            "tracking.enabled=false"], capsys)
    assert rc == 2 and "grid 8x32 differs from the truth grid 16x32" in err


@pytest.mark.slow
def test_regional_forecast_across_greenwich_is_scored_on_its_points_of_a_global_truth(canonical, tmp_path, capsys):
    """A regional forecast written in (-180, 180] as wxray's rollout writes a box across 0 E: the truth's
    points from 315 E eastwards to 45 E as -45..45, against the global [0, 360) truth. It is scored on those
    truth points (climatology and a global baseline cut to them too), exactly as against a truth that is
    that box; with regrid=true the same (a block is not interpolated)."""
    ds = open_store(canonical).load()
    fc = persistence_forecast(ds, ds.time.values[:12], [6, 24])
    fc = fc + 0.01 * fc.latitude  # not persistence itself: a nonzero difference
    box_lon = [lon for lon in ds.longitude.values if lon >= 315 or lon <= 45]

    def as_box(x: xr.Dataset) -> xr.Dataset:
        return x.sel(longitude=box_lon).assign_coords(longitude=lambda d: ((d.longitude + 180) % 360) - 180
                                                      ).sortby("longitude")

    box = as_box(fc)
    np.testing.assert_array_equal(box.longitude.values, np.arange(-45, 45.1, 11.25))
    f_box = write_zarr(box, tmp_path / "box.zarr")
    truth_box = write_raw_store(as_box(ds), tmp_path / "truth_box.zarr")  # its stats: the same climatology
    b_full = write_zarr(persistence_forecast(ds, ds.time.values[2:14], [6, 24]).assign_coords(
        init_time=fc.init_time), tmp_path / "base.zarr")
    for i, baseline in enumerate(("persistence", b_full)):
        argv = [f"forecast={f_box}", f"baseline={baseline}"]
        want = _card([*argv, f"truth={truth_box}"], tmp_path / f"want{i}", capsys)
        for regrid in ("false", "true"):
            got = _card([*argv, f"truth={canonical}", f"regrid={regrid}"], tmp_path / f"got{i}{regrid}", capsys)
            assert "acc" in got.metric.values
            _same_scores(got, want)
            np.testing.assert_allclose(got["rel_diff"].values, want["rel_diff"].values, rtol=1e-9)
            np.testing.assert_array_equal(got.longitude.values, box.longitude.values)
            np.testing.assert_allclose(got["mae_map"].values, want["mae_map"].values, rtol=1e-12)


def test_regrid_from_a_regional_grid_does_not_fill_the_rest_of_a_global_truth(canonical, tmp_path, capsys):
    """A finer regional grid -45..45 (not a block of the truth's points) lies in [0, 360) at 0..45 and
    315..354.375, so its smallest and largest longitudes span the truth's 0..348.75; it still covers only
    its 90-degree arc, and regrid=true onto the global truth is a one-line error naming the file."""
    ds = open_store(canonical).load()
    fc = persistence_forecast(ds, ds.time.values[:12], [6])
    lon = np.arange(-45, 45.1, 5.625)
    fine = fc.sel(longitude=lon % 360, method="nearest").assign_coords(longitude=lon)
    fine = write_zarr(fine, tmp_path / "fine.zarr")
    rc, result, err = run_evaluate([f"forecast={fine}", f"truth={canonical}", "regrid=true",
                                    f"out_dir={tmp_path / 'a'}", "tracking.enabled=false"], capsys)
    lines = err.strip().splitlines()
    assert rc == 2 and result is None and len(lines) == 1, err
    assert lines[0].startswith(f"error: forecast {fine}: regional grid (latitude -84.375..84.375, longitude "
                               f"-45..45) does not cover the truth grid (latitude -84.375..84.375, longitude "
                               f"0..348.75)")
    assert not (tmp_path / "a").exists()
