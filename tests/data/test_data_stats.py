"""Statistics groups against direct numpy computations on tiny synthetic stores."""

from __future__ import annotations

import numpy as np
import pandas as pd
import xarray as xr

import wxray.data.writer as writer
from wxray.data.convert import convert_source
from wxray.data.schema import open_stats
from wxray.data.stats import compute_stats

STEP = np.timedelta64(6, "h")


def _store_source(tmp_path):
    """Long names, 2 trajectories, a gap of two steps; trajectory 1 offset so cross pairs would show."""
    rng = np.random.default_rng(7)
    t0 = pd.date_range("2021-03-01", periods=6, freq="6h")
    # trajectory 1 starts one step after trajectory 0 ends (only the trajectory coord separates them)
    t1 = pd.date_range("2021-03-02T12", periods=3, freq="6h").append(pd.date_range("2021-03-03T12", periods=3,
                                                                                   freq="6h"))
    time = t0.append(t1)
    traj = np.array([0] * 6 + [1] * 6)
    nt, lat, lon = len(time), np.linspace(-80, 80, 4), np.arange(0, 360, 60.0)
    z = 5.4e4 + 300 * rng.standard_normal((nt, 2, 4, 6)) + 2e3 * traj[:, None, None, None]
    t2m = 285 + 3 * rng.standard_normal((nt, 4, 6)) + 40.0 * np.arange(nt)[:, None, None]
    ds = xr.Dataset({"geopotential": (("time", "level", "latitude", "longitude"), z.astype(np.float32)),
                     "2m_temperature": (("time", "latitude", "longitude"), t2m.astype(np.float32))},
                    coords={"time": time, "level": [500, 850], "latitude": lat, "longitude": lon,
                            "trajectory": ("time", traj)})
    ds.to_zarr(tmp_path / "src.zarr", zarr_format=3, consolidated=False)
    return ds


def _reference(ds: xr.Dataset, name: str):
    x = ds[name].values.astype(np.float64)
    axes = (0, 2, 3) if x.ndim == 4 else (0, 1, 2)
    t, traj = ds.time.values, ds.trajectory.values
    ok = [i for i in range(len(t) - 1) if t[i + 1] - t[i] == STEP and traj[i + 1] == traj[i]]
    d = np.stack([x[i + 1] - x[i] for i in ok])
    return x.mean(axis=axes), x.std(axis=axes), d.mean(axis=axes), d.std(axis=axes), len(d)


def test_stats_match_numpy_streamed_in_one_step_blocks(tmp_path, monkeypatch):
    monkeypatch.setattr(writer, "BLOCK_BYTES", 1)  # one time step per block: exercises the streaming merge
    src = _store_source(tmp_path)
    out = tmp_path / "store.zarr"
    convert_source(str(tmp_path / "src.zarr"), out)
    stats = open_stats(out)
    for name in ("geopotential", "2m_temperature"):
        mean, std, dmean, dstd, n_pairs = _reference(src, name)
        assert n_pairs == 9  # 11 consecutive pairs minus the 12 h gap and the trajectory boundary
        np.testing.assert_allclose(stats.mean[name].values, mean, rtol=1e-6, atol=0)
        np.testing.assert_allclose(stats.std[name].values, std, rtol=1e-6, atol=0)
        np.testing.assert_allclose(stats.diff_mean[name].values, dmean, rtol=1e-6, atol=0)
        np.testing.assert_allclose(stats.diff_std[name].values, dstd, rtol=1e-6, atol=0)
        assert stats.mean[name].dtype == np.float64
    assert stats.mean.geopotential.dims == ("level",) and stats.mean["2m_temperature"].dims == ()
    assert stats.mean.level.values.tolist() == [500, 850]
    clim = stats.climatology.geopotential
    assert clim.dims == ("dayofyear", "hour", "level", "latitude", "longitude") and clim.dtype == np.float32
    assert clim.encoding["chunks"] == (1, 1, 2, 4, 6)


def _circ(a, b):
    d = abs(int(a) - int(b)) % 366
    return min(d, 366 - d)


def test_climatology_window_wraps_the_year_and_skips_nan():
    days = pd.date_range("2019-12-20", "2020-01-10", freq="12h")
    time = days.append(pd.DatetimeIndex(["2020-03-01T06"]))
    rng = np.random.default_rng(3)
    x = (250 + 10 * rng.standard_normal((len(time), 3, 4))).astype(np.float32)
    x[5, 1, 2] = np.nan
    x[6, :, :] = np.nan
    ds = xr.Dataset({"temperature": (("time", "latitude", "longitude"), x)},
                    coords={"time": time, "latitude": [-30.0, 0.0, 30.0], "longitude": [0.0, 90, 180, 270]})
    w = 3
    clim = compute_stats(ds, clim_window_days=w, block_bytes=48)["climatology"].temperature
    doy, hour = np.asarray(time.dayofyear), np.asarray(time.hour)
    assert clim.dayofyear.values.tolist() == sorted(set(doy.tolist()))  # only days present
    assert clim.hour.values.tolist() == [0, 6, 12]
    for d in clim.dayofyear.values:
        for h in clim.hour.values:
            sel = (hour == h) & np.array([_circ(d, k) <= w for k in doy])
            if not sel.any():
                assert np.isnan(clim.sel(dayofyear=d, hour=h).values).all()
                continue
            with np.errstate(invalid="ignore"), np.testing.suppress_warnings() as sup:
                sup.filter(RuntimeWarning)
                want = np.nanmean(x[sel].astype(np.float64), axis=0)
            np.testing.assert_allclose(clim.sel(dayofyear=d, hour=h).values, want, rtol=1e-6)
    # explicit wrap: day 1 at 00 UTC pools days 364, 365 of 2019 (distance 3 and 2 on the 366-day circle;
    # 2019-12-29 is day 363, distance 4) and days 1..4 of 2020
    wrap = (time.hour == 0) & (time >= "2019-12-30") & (time <= "2020-01-04")
    np.testing.assert_allclose(clim.sel(dayofyear=1, hour=0).values, np.nanmean(x[wrap], axis=0), rtol=1e-6)
    # a single sample at 06 UTC: its own value there, and NaN at 06 UTC in January (no sample in window)
    np.testing.assert_array_equal(clim.sel(dayofyear=61, hour=6).values, x[-1])
    assert np.isnan(clim.sel(dayofyear=1, hour=6).values).all()


def test_nan_values_are_skipped_by_mean_and_std():
    time = pd.date_range("2000-01-01", periods=5, freq="6h")
    x = np.arange(5 * 2 * 3, dtype=np.float32).reshape(5, 2, 3) ** 1.5
    x[2, 0, 1] = np.nan
    ds = xr.Dataset({"2m_temperature": (("time", "latitude", "longitude"), x)},
                    coords={"time": time, "latitude": [-45.0, 45.0], "longitude": [0.0, 120, 240]})
    s = compute_stats(ds)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(s["mean"]["2m_temperature"].values, np.nanmean(x64), rtol=1e-6)
    np.testing.assert_allclose(s["std"]["2m_temperature"].values, np.nanstd(x64), rtol=1e-6)
    d = np.diff(x.astype(np.float64), axis=0)
    np.testing.assert_allclose(s["diff_std"]["2m_temperature"].values, np.nanstd(d), rtol=1e-6)
