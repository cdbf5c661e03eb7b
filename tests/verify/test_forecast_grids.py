"""Grid orientation on read: either latitude order, either longitude convention, global or regional grids."""

from __future__ import annotations

import dask.array
import numpy as np
import pytest
import xarray as xr

from tests.verify.conftest import make_store, write_stats
from wxray.data.schema import open_store
from wxray.errors import DataError
from wxray.verify.forecasts import (
    check_grid,
    longitude_arc,
    open_forecast,
    open_truth,
    persistence_forecast,
    regrid_like,
)
from wxray.verify.spatial import Region, latitude_weights, region_mask

UK_LAT, UK_LON = np.arange(50.0, 60.01, 0.5), np.arange(-10.0, 2.01, 0.5)  # 10 W .. 2 E


def flip(ds: xr.Dataset) -> xr.Dataset:
    """As ARCO-ERA5 / GRIB lay it out: latitude north to south, longitude in [-180, 180)."""
    lon = ((ds.longitude + 180.0) % 360.0) - 180.0
    return ds.assign_coords(longitude=lon).sortby("longitude").isel(latitude=slice(None, None, -1))


def write_raw_store(ds: xr.Dataset, path) -> str:
    """A zarr store written as is (no converter), with stats groups computed from `ds`."""
    enc = {v: {"chunks": (1, *ds[v].shape[1:])} for v in ds.data_vars if "time" in ds[v].dims}
    ds.to_zarr(path, mode="w", zarr_format=3, consolidated=False, encoding=enc)
    write_stats(ds, path)
    return str(path)


def uk_field(lat=UK_LAT, lon=UK_LON, times=4) -> xr.Dataset:
    t = np.arange(times)[:, None, None]
    f = 280 + np.cos(np.deg2rad(lat))[None, :, None] * 10 * np.sin(np.deg2rad(lon + 5 * t))[:, None, :].squeeze(1)
    return xr.Dataset({"2m_temperature": (("time", "latitude", "longitude"), f.astype(np.float32))},
                      coords={"time": np.arange(times) * np.timedelta64(6, "h") + np.datetime64("2020-01-01"),
                              "latitude": lat, "longitude": lon})


def test_truth_store_north_to_south_in_minus_180_is_oriented_lazily(tmp_path):
    canonical = open_store(make_store(tmp_path / "c.zarr")).load()
    raw = write_raw_store(flip(canonical), tmp_path / "raw.zarr")
    truth, clim = open_truth(raw)
    assert isinstance(truth["geopotential"].data, dask.array.Array)  # nothing loaded
    np.testing.assert_array_equal(truth.latitude.values, canonical.latitude.values)
    np.testing.assert_allclose(truth.longitude.values, canonical.longitude.values, atol=1e-9)
    xr.testing.assert_equal(truth["geopotential"].load().drop_vars(["longitude"]),
                            canonical["geopotential"].drop_vars(["longitude"]))
    _, want_clim = open_truth(make_store(tmp_path / "c2.zarr"))
    np.testing.assert_array_equal(clim["2m_temperature"].values, want_clim["2m_temperature"].values)
    assert clim.latitude.values[0] < 0 and clim.longitude.values[0] == 0


def test_regional_truth_crossing_greenwich_keeps_its_box_and_forecasts_match_it(tmp_path):
    uk = uk_field()
    split = uk.assign_coords(longitude=uk.longitude % 360).sortby("longitude")  # 0..2 then 350..359.5
    split.isel(latitude=slice(None, None, -1)).to_netcdf(tmp_path / "uk.nc")
    truth, clim = open_truth(tmp_path / "uk.nc")
    assert clim is None
    np.testing.assert_array_equal(truth.longitude.values, UK_LON)
    np.testing.assert_array_equal(truth["2m_temperature"].values, uk["2m_temperature"].values)
    fc = persistence_forecast(split.sortby("latitude"), split.time.values[:2], [6])  # forecast in [0, 360)
    out = check_grid(fc, truth, "forecast f.zarr", regrid=False)
    np.testing.assert_array_equal(out.longitude.values, UK_LON)
    np.testing.assert_array_equal(out["2m_temperature"].sel(lead_time=np.timedelta64(6, "h")).values,
                                  uk["2m_temperature"].isel(time=[0, 1]).values)
    shifted = fc.assign_coords(longitude=fc.longitude + 0.25)
    with pytest.raises(DataError, match=r"forecast f.zarr: grid 21x25 differs .* longitude -9.75..2.25 vs"):
        check_grid(shifted, truth, "forecast f.zarr", regrid=False)


def test_regrid_global_onto_regional_and_regional_must_cover(tmp_path):
    truth = uk_field()
    lat, lon = np.arange(-90, 90.1, 1.0), np.arange(0, 360, 1.0)
    glob = uk_field(lat, lon).rename(time="init_time").expand_dims(lead_time=[np.timedelta64(0, "h")], axis=1)
    out = check_grid(glob, truth, "forecast g.zarr", regrid=True)  # across the 359..0 seam
    np.testing.assert_allclose(out["2m_temperature"].isel(lead_time=0).values,
                               truth["2m_temperature"].values, atol=2e-3)
    small = glob.sel(latitude=slice(49, 61), longitude=slice(0, 10))
    with pytest.raises(DataError, match=r"forecast s.zarr: regional grid .* does not cover the truth grid"):
        regrid_like(small, truth, "forecast s.zarr")
    box = out.isel(longitude=slice(0, None, 2))  # a coarser regional grid inside the box: no extrapolation
    again = regrid_like(box.sortby("latitude"), truth.isel(longitude=slice(0, -1)), "forecast b.zarr")
    assert np.isfinite(again["2m_temperature"].values).all()


def test_forecast_north_to_south_in_minus_180_opens_oriented(tmp_path):
    ds = open_store(make_store(tmp_path / "s.zarr"))
    fc = persistence_forecast(ds, ds.time.values[:3], [6])
    flip(fc).to_zarr(tmp_path / "f.zarr", zarr_format=3, consolidated=False)
    got = open_forecast(tmp_path / "f.zarr")
    assert got.longitude.values[0] == 0 and np.all(np.diff(got.latitude.values) > 0)
    np.testing.assert_array_equal(got["geopotential"].values, fc["geopotential"].values)


def test_region_masks_cross_greenwich_in_either_convention():
    lat = xr.DataArray(UK_LAT, dims="latitude", coords={"latitude": UK_LAT})
    for lon_values in (UK_LON, UK_LON % 360):
        lon = xr.DataArray(lon_values, dims="longitude", coords={"longitude": lon_values})
        europe = region_mask("europe", lat, lon)
        assert bool(europe.all())  # 10 W..2 E, 50..60 N lies inside 12.5 W..42.5 E, 35..75 N
        for box in (Region("west", 49, 61, -5.2, 0.2), Region("west", 49, 61, 354.8, 0.2)):
            m = region_mask(box, lat, lon).isel(latitude=0)
            assert sorted(m.longitude.values[m.values] % 360) == [0.0, 355.0, 355.5, 356.0, 356.5, 357.0,
                                                                 357.5, 358.0, 358.5, 359.0, 359.5]
    global_lon = xr.DataArray(np.arange(0, 360, 1.0), dims="longitude")
    assert bool(region_mask(Region("all", lon_min=-180, lon_max=180), lat, global_lon).all())


def test_latitude_weights_of_a_regional_grid_are_cell_areas():
    w = latitude_weights(UK_LAT)  # 50..60 N: the edge cells span half a spacing beyond the edge rows
    lo, hi = np.deg2rad(UK_LAT - 0.25), np.deg2rad(UK_LAT + 0.25)
    area = np.sin(hi) - np.sin(lo)
    np.testing.assert_allclose(w.values, area / area.mean(), rtol=1e-12)
    full = latitude_weights(np.arange(-90, 90.1, 0.5))  # global: the same rows, in the same proportions
    sub = full.sel(latitude=UK_LAT).values
    np.testing.assert_allclose(w.values, sub / sub.mean(), rtol=1e-12)


def test_longitude_arc_is_the_canonical_box():
    assert longitude_arc(np.r_[0:46:15.0, 315:360:15.0]) == (-45.0, 45.0)  # across 0 E, given in [0, 360)
    assert longitude_arc(np.arange(-45, 46, 15.0)) == (-45.0, 45.0)
    assert longitude_arc(np.arange(240, 296, 5.0)) == (240.0, 295.0)  # fits in [0, 360)
    assert longitude_arc(np.arange(-180, 180, 11.25)) == (0.0, 348.75)  # global: [0, 360)
    assert longitude_arc(np.r_[150:181:10.0, -170:-149:10.0]) == (150.0, 210.0)  # across 180 E: [0, 360)


def test_regrid_from_a_regional_grid_across_greenwich_interpolates_inside_its_arc_only():
    """A 1-degree box 20 W..20 E given in [0, 360) order (0..20, then 340..359): its smallest and largest
    longitude span the whole circle, its arc does not. Targets inside the arc (in either convention) get the
    bilinear values; a target outside it, in the 20 E..340 E gap, is an error, not a value across the gap."""
    lat = np.arange(40.0, 60.1, 1.0)
    lon = np.r_[0:20.1:1.0, 340:359.1:1.0]
    src = uk_field(lat, lon).rename(time="init_time")
    inside_lat, inside_lon = np.arange(45.25, 55, 2.5), np.arange(-17.5, 18, 2.5)
    want = uk_field(inside_lat, inside_lon).rename(time="init_time")["2m_temperature"]  # smooth in lon
    for target_lon in (inside_lon, inside_lon % 360):
        target = want.assign_coords(longitude=target_lon)
        got = regrid_like(src, target, "forecast r.zarr")["2m_temperature"]
        np.testing.assert_array_equal(got.longitude.values, target_lon)
        np.testing.assert_allclose(got.values, want.values, atol=0.02)  # bilinear error on a 1-degree grid
    across = want.assign_coords(longitude=np.arange(-17.5, 18, 2.5) + 35)  # 17.5..52.5 E: beyond 20 E
    with pytest.raises(DataError, match=r"forecast r.zarr: regional grid \(latitude 40..60, longitude -20..20\) does "
                                        r"not cover the truth grid \(latitude 45.25..52.75, longitude 17.5..52.5\)"):
        regrid_like(src, across, "forecast r.zarr")
