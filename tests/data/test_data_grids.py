"""Grid conventions of the converter: global grids in [0, 360), regional boxes contiguous, recorded in attrs."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from tests.data.data_helpers import synthetic
from wxray.data.convert import convert_source
from wxray.data.schema import canonical_longitudes, grid_kind, open_stats, open_store, wrap_longitudes
from wxray.errors import DataError

UK_LON = -10.0 + 0.25 * np.arange(49)  # 10 W .. 2 E


def _box(lon: np.ndarray, nlat: int = 5, n_times: int = 4) -> xr.Dataset:
    src = synthetic(n_times=n_times, nlat=nlat, nlon=lon.size)
    return src.assign_coords(lat=np.linspace(60, 50, nlat), lon=lon)  # north to south, as in ERA5


def _convert(src: xr.Dataset, tmp_path, name: str) -> xr.Dataset:
    path = tmp_path / f"{name}.nc"
    src.to_netcdf(path)
    convert_source(str(path), tmp_path / f"{name}.zarr")
    return open_store(tmp_path / f"{name}.zarr")


@pytest.mark.parametrize("given", ["negative", "wrapped"])
def test_box_crossing_greenwich_stays_contiguous(tmp_path, given):
    lon = UK_LON if given == "negative" else np.mod(UK_LON, 360.0)  # 350..359.75 then 0..2
    src = _box(lon)
    ds = _convert(src, tmp_path, given)
    np.testing.assert_array_equal(ds.longitude.values, UK_LON)
    assert ds.attrs["grid_kind"] == "regional" and ds.attrs["longitude_convention"] == "-180-180"
    assert np.all(np.diff(ds.latitude.values) > 0)
    want = src.t2m.assign_coords(lon=wrap_longitudes(src.lon.values, "-180-180")).sortby("lat").sortby("lon")
    np.testing.assert_array_equal(ds["2m_temperature"].values, want.values)
    # the value at 1 W, 52.5 N is where the source had it
    np.testing.assert_array_equal(ds.temperature.sel(level=500, latitude=52.5, longitude=-1.0).values,
                                  src.t.sel(level=500, lat=52.5, lon=359.0 if given == "wrapped" else -1.0).values)
    clim = open_stats(tmp_path / f"{given}.zarr").climatology
    np.testing.assert_array_equal(clim.longitude.values, UK_LON)


@pytest.mark.parametrize("lon", [20.0 + 0.5 * np.arange(41), -60.0 + 0.5 * np.arange(81)],
                         ids=["20E-40E", "60W-20W"])
def test_box_not_crossing_greenwich_is_in_0_360(tmp_path, lon):
    ds = _convert(_box(lon), tmp_path, "box")
    np.testing.assert_array_equal(ds.longitude.values, np.mod(lon, 360.0))
    assert ds.attrs["grid_kind"] == "regional" and ds.attrs["longitude_convention"] == "0-360"


@pytest.mark.parametrize("lon_start", [0.0, -180.0])
def test_global_grid_is_in_0_360(tmp_path, lon_start):
    src = synthetic(n_times=4, nlat=7, nlon=120, lon_start=lon_start)  # 0..357 or -180..177, 3 degrees
    path = tmp_path / "g.nc"
    src.to_netcdf(path)
    convert_source(str(path), tmp_path / "g.zarr")
    ds = open_store(tmp_path / "g.zarr")
    np.testing.assert_array_equal(ds.longitude.values, 3.0 * np.arange(120))
    assert ds.attrs["grid_kind"] == "global" and ds.attrs["longitude_convention"] == "0-360"
    want = src.t2m.assign_coords(lon=np.mod(src.lon.values, 360.0)).sortby("lat").sortby("lon")
    np.testing.assert_array_equal(ds["2m_temperature"].values, want.values)


def test_canonical_longitudes_rules():
    assert grid_kind(np.arange(0, 360, 0.25).astype(np.float32)) == "global"  # float32 coordinates
    assert grid_kind(np.arange(0, 359, 0.25)) == "regional"  # a column short of the circle
    lon, kind, conv = canonical_longitudes(np.array([180.0, 185.0, 190.0]), "f.nc")  # 180 E .. 170 W
    assert lon.tolist() == [180, 185, 190] and (kind, conv) == ("regional", "0-360")
    lon, _, conv = canonical_longitudes(np.array([170.0, 175.0, 180.0, -175.0]), "f.nc")  # across 180 E
    assert lon.tolist() == [170, 175, 180, 185] and conv == "0-360"
    with pytest.raises(DataError, match="f.nc: longitude 0 E appears twice"):
        canonical_longitudes(np.arange(0, 361, 90.0), "f.nc")
    box = np.arange(100, 411, 10.0)  # 100 E eastwards to 50 E: crosses 180 E and 0 E
    with pytest.raises(DataError, match="f.nc: regional longitudes from 100 E eastwards to 50 E cross both"):
        canonical_longitudes(box, "f.nc")
    assert canonical_longitudes(box, "f.nc", split_ok=True)[2] == "0-360"


def test_open_store_rejects_a_split_or_mislabelled_regional_store(tmp_path):
    ds = _convert(_box(UK_LON), tmp_path, "uk")
    split = ds.load().assign_coords(longitude=np.mod(UK_LON, 360.0)).sortby("longitude")
    split.to_zarr(tmp_path / "split.zarr", zarr_format=3, consolidated=False)
    with pytest.raises(DataError, match="split.zarr: longitudes 0..359.75 break the store convention"):
        open_store(tmp_path / "split.zarr")
    ds.load().assign_attrs(longitude_convention="0-360").to_zarr(tmp_path / "label.zarr", zarr_format=3,
                                                                 consolidated=False)
    with pytest.raises(DataError, match="label.zarr: attrs say longitude_convention='0-360'"):
        open_store(tmp_path / "label.zarr")
