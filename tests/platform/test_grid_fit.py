"""data.grid_fit: grids the patch size does not divide (ERA5 / WeatherBench 2 grids with both poles)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.fixture_files import ERAINT
from tests.mlflow_db import fresh_uri
from tests.tiny_store import write_tiny_store
from wxray.data.gridfit import fit_grid
from wxray.data.schema import open_stats, open_store
from wxray.data.windows import WindowConfig, WindowReader, fit_spec, make_spec
from wxray.errors import ConfigError
from wxray.models import lat_weighted_mse, latitude_weights


@pytest.fixture
def odd_store(tmp_path):
    path = tmp_path / "odd.zarr"
    ds = write_tiny_store(path, n_traj=2, steps=10, grid=(9, 16), levels=(500,))
    return path, ds


def _spec(path, patch, mode, **kw):
    cfg = WindowConfig(**{"history": 2, "lead_steps": 1, "grid_fit": mode, **kw})
    return fit_spec(make_spec(str(path), open_store(path), open_stats(path), cfg), patch, mode)


def test_fit_rules():
    assert fit_grid(9, 16, 2, "crop").rows == (1, 9)  # the southernmost row goes (WB2 order: the last)
    assert fit_grid(11, 16, 4, "crop").rows == (2, 10)  # surplus split, the odd one at the south
    assert fit_grid(9, 16, 3, "crop").cols == (0, 15)  # surplus columns: the easternmost
    assert fit_grid(9, 16, 4, "pad").pad_rows == (2, 1) and fit_grid(9, 16, 3, "pad").pad_cols == (0, 2)
    assert fit_grid(8, 16, 2, "error").model_grid == (8, 16)
    fit = fit_grid(9, 16, 3, "pad")
    a = np.arange(9 * 16, dtype=np.float32).reshape(1, 9, 16)
    padded = fit.pad(a)
    assert padded.shape == (1, 9, 18) == (1, *fit.model_grid)
    np.testing.assert_array_equal(padded[..., 16:], a[..., :2])  # longitude wraps: periodic, no reflection
    reflect = fit_grid(9, 16, 4, "pad").pad(a)
    np.testing.assert_array_equal(reflect[0, :2], a[0, [2, 1]])  # rows reflect about the edge row
    np.testing.assert_array_equal(reflect[0, -1], a[0, 7])
    for arr in (a, torch.from_numpy(a)):
        for f in (fit, fit_grid(9, 16, 4, "pad")):
            back = f.unpad(f.pad(arr))
            assert back.shape == arr.shape and bool((back == arr).all())
    w = fit_grid(9, 16, 4, "pad").row_weights(torch.ones(9))
    assert w.tolist() == [0, 0] + [1] * 9 + [0]


def test_error_mode_is_one_line_naming_the_key(odd_store):
    path, _ = odd_store
    with pytest.raises(ConfigError) as e:
        _spec(path, 2, "error")
    assert "data.grid_fit=error" in str(e.value) and "9x16" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="data.grid_fit must be one of"):
        WindowConfig(grid_fit="squeeze").validate()
    with pytest.raises(ConfigError, match="larger than the grid"):
        _spec(path, 10, "crop")


def test_crop_reads_the_kept_rows(odd_store):
    path, ds = odd_store
    spec = _spec(path, 2, "crop")
    assert spec.grid == spec.kept_grid == (8, 16)
    np.testing.assert_array_equal(spec.latitude, ds.latitude.values[1:])
    out = WindowReader(spec)({"anchor": np.array([3, 12])})
    assert out["x"].shape == (2, 2 * 2 + 1, 8, 16) and out["y"].shape == (2, 2, 8, 16)
    z = ds.geopotential.sel(level=500).values
    np.testing.assert_allclose(out["x"][0, 2] * spec.in_std[0] + spec.in_mean[0], z[3, 1:], rtol=1e-5)
    lsm = (ds.land_sea_mask.values[1:] - spec.const_mean[0]) / spec.const_std[0]
    np.testing.assert_allclose(out["x"][1, -1], lsm, rtol=1e-5)


def test_pad_reads_padded_windows_and_masks_the_padding(odd_store):
    from wxray.platform.train.tasks import validate

    path, ds = odd_store
    spec = _spec(path, 2, "pad")
    assert spec.grid == (10, 16) and spec.kept_grid == (9, 16)
    np.testing.assert_array_equal(spec.latitude, ds.latitude.values)
    out = WindowReader(spec)({"anchor": np.array([3, 12, 14])})
    x, y = (torch.from_numpy(out[k]) for k in ("x", "y"))
    assert x.shape == (3, 5, 10, 16)
    z = ds.geopotential.sel(level=500).values
    np.testing.assert_allclose(spec.unpad(out["x"])[0, 2] * spec.in_std[0] + spec.in_mean[0], z[3], rtol=1e-5)
    np.testing.assert_array_equal(out["x"][:, :, 0], out["x"][:, :, 2])  # the south pad row reflects row 1

    lat_w = latitude_weights(torch.as_tensor(spec.latitude, dtype=torch.float32))
    noise_on_pad = torch.zeros_like(y)
    noise_on_pad[:, :, 0] = 50.0
    noise_on_kept = torch.zeros_like(y)
    noise_on_kept[:, :, 5] = 50.0
    exact = lat_weighted_mse(spec.unpad(y), spec.unpad(y), lat_w)
    assert lat_weighted_mse(spec.unpad(y + noise_on_pad), spec.unpad(y), lat_w) == exact == 0
    assert lat_weighted_mse(spec.unpad(y + noise_on_kept), spec.unpad(y), lat_w) > 0

    class Oracle(torch.nn.Module):  # the target, plus a fixed error
        def __init__(self, err):
            super().__init__()
            self.err = err

        def forward(self, x_, generator=None):
            return y + self.err

    dummy = {"x": torch.zeros(1, *x.shape[1:]), "y": torch.zeros(1, *y.shape[1:])}
    args = (spec, lat_w, torch.device("cpu"), 1, None, 0, dummy)
    clean = validate(Oracle(noise_on_pad), [{"x": x, "y": y}], *args)
    assert clean["val/loss"] == 0 and all(v == 0 for k, v in clean.items() if k.startswith("val/rmse/"))
    assert validate(Oracle(noise_on_kept), [{"x": x, "y": y}], *args)["val/loss"] > 0


@pytest.fixture(scope="module")
def eraint_store(tmp_path_factory):
    """A real global grid (ERA-Interim 0.75 deg, 241 x 480, both poles) converted as prepare_data does."""
    from wxray.data.convert import convert_source

    out = tmp_path_factory.mktemp("eraint") / "eraint.zarr"
    # A climatology window that spans both months: the climatology is their mean, so anomalies exist.
    convert_source(str(ERAINT), out, variables=["z"], levels=[500], clim_window_days=183, progress=False)
    return out


def test_eraint_grid_crops_to_the_paper_layout_and_forecasts(eraint_store):
    from wxray.data.schema import open_climatology
    from wxray.forecast.rollout import rollout, to_forecast_dataset
    from wxray.models.registry import ModelConfig, build_forecaster
    from wxray.verify.lead_scores import rollout_report

    store = open_store(eraint_store)
    assert store.sizes["latitude"] == 241 and store.latitude.values[0] == -90
    crop = _spec(eraint_store, 2, "crop", history=1)  # p = 2: 180 of 181 rows at 1 deg; here 240 of 241
    assert crop.grid == (240, 480) and crop.latitude[0] == -89.25 and crop.latitude[-1] == 90
    assert WindowReader(crop)({"anchor": np.array([0])})["x"].shape == (1, 1, 240, 480)
    pad = _spec(eraint_store, 2, "pad", history=1)
    assert pad.grid == (242, 480) and len(pad.latitude) == 241

    # A forward of a tiny model (p = 4 keeps it quick on CPU; 241 is prime, so any p > 1 needs the fit).
    spec = _spec(eraint_store, 4, "crop", history=1)
    torch.manual_seed(0)
    model = build_forecaster(ModelConfig(patch_size=4, embed_dim=8, depth=2, num_heads=1, split=(1, 0, 1),
                                         keep_ratio=1.0, skip_channels=4), spec)
    anchors = np.array([0])  # January -> July: the file's two monthly means, one step apart
    fc = rollout(model, spec, anchors, steps=1)
    assert fc.shape == (1, 1, 1, 240, 480) and np.isfinite(fc).all()
    forecast = to_forecast_dataset(fc, spec, store, anchors)
    np.testing.assert_array_equal(forecast.latitude.values, store.latitude.values[1:])
    assert forecast.geopotential.attrs["units"] == "m**2 s**-2"
    report = rollout_report(forecast, store, open_climatology(eraint_store))
    assert report["units"] == {"geopotential_500": "m**2 s**-2"}
    for key in ("rmse", "acc", "persistence_rmse"):
        assert np.isfinite(report[key]["geopotential_500"][0])
    # Persistence of January for July against the mean of the two: anomalies of opposite sign.
    np.testing.assert_allclose(report["persistence_acc"]["geopotential_500"][0], -1.0, atol=1e-6)


@pytest.mark.slow
def test_training_on_a_padded_grid_and_its_routing_ensemble(ray_session, tmp_path, capsys):
    """pad end to end: loss and validation on the kept rows, forecast.zarr with members, evaluate.py."""
    import json

    import xarray as xr

    from wxray.job import run_job
    from wxray.platform.train.config import TrainSparseConfig
    from wxray.platform.train.sparse import train_sparse
    from wxray.verify.evaluate import EvaluateConfig, evaluate

    store = tmp_path / "odd.zarr"
    ds = write_tiny_store(store, n_traj=2, steps=24, grid=(9, 16), levels=(500,))
    out = tmp_path / "run"
    argv = [f"data.store={store}", "data.grid_fit=pad", "data.generate_sample=false",
            "data.test_range=2000-01-08T06/2000-01-12T18", "data.val_range=2000-01-07/2000-01-08",
            "data.train_range=2000-01-01/2000-01-06T18", "model.embed_dim=16", "model.depth=3",
            "model.split=[1,1,1]", "model.num_heads=2", "model.keep_ratio=0.5", "data.batch_size=4",
            "train.epochs=1", "train.rollout_steps=2", "train.routing_members=2",
            "forecast_workers.actors=1",  # the forecast after training on a Ray actor holding the final model
            f"out_dir={out}", f"tracking.uri={fresh_uri(tmp_path, 'm.db')}"]

    def result(rc):
        cap = capsys.readouterr()
        assert rc == 0, cap.err
        return json.loads([ln for ln in cap.out.splitlines() if ln.startswith("RESULT ")][-1][7:])

    res = result(run_job("train_sparse", TrainSparseConfig, train_sparse, argv))
    assert np.isfinite(res["val_loss"]) and set(res["val_rmse"]) == {"geopotential_500", "temperature_500"}
    roll = res["rollout"]
    assert roll["members"] == 2 and roll["lead_hours"] == [6, 12] and roll["inits"] >= 4
    assert set(roll) >= {"rmse", "persistence_rmse", "units"}
    fc = xr.open_zarr(res["forecast"])
    assert fc.sizes["member"] == 2 and fc.sizes["latitude"] == 9  # every real row, no padding
    np.testing.assert_array_equal(fc.latitude.values, ds.latitude.values)
    assert (out / "forecast_map_test.png").stat().st_size > 1000
    meta = json.loads((Path(res["checkpoint"]) / "meta.json").read_text())
    assert meta["data"]["grid_fit"] == "pad" and meta["data"]["store"] == str(store.resolve())
    assert meta["normalisation"]["targets"] == ["geopotential_500", "temperature_500"]  # forecasts on other stores
    state = torch.load(Path(res["checkpoint"]) / "state.pt", weights_only=True)
    assert state["next_epoch"] == meta["epoch"] == res["epochs"] == 1 and "epoch" not in state  # epochs completed
    card = result(run_job("evaluate", EvaluateConfig, evaluate,
                          [f"forecast={res['forecast']}", f"truth={store}", "n_bootstrap=200", "plots=false",
                           f"out_dir={tmp_path / 'ev'}", f"tracking.uri=sqlite:///{tmp_path}/m.db"]))
    assert any(k.startswith("crps.") for k in card) and any(k.startswith("ssr.") for k in card), card


def test_pad_wraps_global_columns_and_reflects_regional_ones():
    a = np.arange(5.0)[None, :].repeat(2, axis=0)  # 2 x 5 grid, patch 2: one column to add
    assert fit_grid(2, 5, 2, "pad").pad(a)[0].tolist() == [0, 1, 2, 3, 4, 0]  # global: column 0 is next
    assert fit_grid(2, 5, 2, "pad", periodic=False).pad(a)[0].tolist() == [0, 1, 2, 3, 4, 3]  # regional box
