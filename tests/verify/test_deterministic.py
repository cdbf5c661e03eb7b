"""Deterministic scores: RMSE/MAE/bias against `scores`, ACC and SSIM properties."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import scores
import xarray as xr

from wxray.errors import DataError
from wxray.verify.deterministic import acc, bias, climatology_at, mae, mse, rmse, ssim
from wxray.verify.spatial import latitude_weights

LAT = np.linspace(-84.375, 84.375, 16)
LON = np.arange(32) * 11.25


def _fields(rng, n_init=5, scale=1.0):
    coords = {"init_time": pd.date_range("2020-01-01", periods=n_init, freq="6h"), "latitude": LAT,
              "longitude": LON}
    return xr.DataArray(scale * rng.standard_normal((n_init, 16, 32)), dims=tuple(coords), coords=coords)


def test_rmse_mae_bias_match_scores_with_latitude_weights():
    rng = np.random.default_rng(0)
    f, t = _fields(rng) + 0.3, _fields(rng)
    w = latitude_weights(f.latitude)
    keep = ["init_time"]
    ref_rmse = scores.continuous.rmse(f, t, preserve_dims=keep, weights=w)
    np.testing.assert_allclose(np.sqrt(mse(f, t)).values, ref_rmse.values, rtol=1e-12)
    np.testing.assert_allclose(mae(f, t).values, scores.continuous.mae(f, t, preserve_dims=keep, weights=w).values,
                               rtol=1e-12)
    np.testing.assert_allclose(bias(f, t).values,
                               scores.continuous.additive_bias(f, t, preserve_dims=keep, weights=w).values,
                               rtol=1e-12)
    # RMSE over time is the root of the time-mean MSE (WeatherBench 2), not the mean of per-init RMSEs.
    overall = float(rmse(f, t, time_dims=["init_time"]))
    assert overall == pytest.approx(float(np.sqrt(mse(f, t).mean())), rel=1e-12)
    assert overall > float(np.sqrt(mse(f, t)).mean())


def test_acc_perfect_inverted_and_scale_invariant():
    rng = np.random.default_rng(1)
    truth, clim = _fields(rng, scale=2.0) + 280.0, _fields(rng) + 280.0
    np.testing.assert_allclose(acc(truth, truth, clim).values, 1.0, rtol=1e-12)
    np.testing.assert_allclose(acc(clim + 3.0 * (truth - clim), truth, clim).values, 1.0, rtol=1e-12)
    np.testing.assert_allclose(acc(clim - (truth - clim), truth, clim).values, -1.0, rtol=1e-12)
    noisy = acc(truth + _fields(rng, scale=2.0), truth, clim).values
    assert np.all(noisy < 0.95) and np.all(noisy > 0.3)


def test_climatology_lookup_by_dayofyear_and_hour():
    clim = xr.DataArray(np.arange(366 * 4, dtype=float).reshape(366, 4), dims=("dayofyear", "hour"),
                        coords={"dayofyear": np.arange(1, 367), "hour": [0, 6, 12, 18]}, name="t2m")
    valid = xr.DataArray(pd.to_datetime(["2020-01-01T00", "2020-12-31T18", "2020-03-01T06"]), dims="init_time")
    np.testing.assert_array_equal(climatology_at(clim, valid).values, [0, 365 * 4 + 3, 60 * 4 + 1])
    with pytest.raises(DataError, match="hour"):
        climatology_at(clim, xr.DataArray(pd.to_datetime(["2020-01-01T03"]), dims="init_time"))


def test_ssim_identity_noise_and_periodic_longitude():
    rng = np.random.default_rng(2)
    base = _fields(rng, n_init=2)
    smooth = base.rolling(longitude=5, center=True, min_periods=1).mean().rolling(latitude=3, center=True,
                                                                               min_periods=1).mean()
    np.testing.assert_allclose(ssim(smooth, smooth).values, 1.0, rtol=1e-12)
    s = [float(ssim(smooth + a * _fields(rng, n_init=2), smooth).mean()) for a in (0.05, 0.2, 0.8)]
    assert 1 > s[0] > s[1] > s[2]
    independent = float(ssim(_fields(rng, n_init=2), _fields(rng, n_init=2)).mean())
    assert abs(independent) < 0.1
    # Rolling both fields in longitude must not change SSIM: the window wraps, there is no seam at 0.
    noisy = smooth + 0.3 * _fields(rng, n_init=2)
    rolled = ssim(noisy.roll(longitude=7), smooth.roll(longitude=7))
    np.testing.assert_allclose(rolled.values, ssim(noisy, smooth).values, rtol=1e-10)


def test_ssim_on_a_regional_grid_does_not_wrap_longitude():
    """A regional box's west and east edges are not neighbours: what lies at the east edge must not reach
    the SSIM window at the west edge, while on a global grid the window wraps (no seam at 0 E)."""
    rng = np.random.default_rng(3)
    truth = _fields(rng, n_init=2).rolling(longitude=3, center=True, min_periods=1).mean()
    forecast = truth + 0.3 * _fields(rng, n_init=2)
    box_t, box_f = truth.isel(longitude=slice(0, 16)), forecast.isel(longitude=slice(0, 16))  # 0..168.75 E
    west = xr.zeros_like(box_t.isel(init_time=0), dtype=bool)
    west[:, :4] = True  # the 4 westmost columns: more than the window's reach (5 cells) from the east edge
    changed = box_f.copy()
    changed[..., -1] += 50.0  # a large change in the eastmost column only
    np.testing.assert_allclose(ssim(changed, box_t, region=west).values, ssim(box_f, box_t, region=west).values,
                               rtol=1e-12)
    whole = forecast.copy()
    whole[..., -1] += 50.0  # on the global grid the eastmost column is the westmost one's neighbour
    west_global = xr.zeros_like(truth.isel(init_time=0), dtype=bool)
    west_global[:, :4] = True
    assert np.all(np.abs(ssim(whole, truth, region=west_global).values
                         - ssim(forecast, truth, region=west_global).values) > 1e-3)
