"""Conversion of real and synthetic sources into stores: names, axes, dtype, chunks, values."""

from __future__ import annotations

import warnings

import cfgrib
import eccodes
import numpy as np
import pandas as pd
import pytest
import xarray as xr

import wxray.data.writer as writer
from tests.data.data_helpers import ERAINT, MEMBERS, assert_failed_cleanly, synthetic, to_store_order
from wxray.data.convert import convert_source
from wxray.data.schema import open_stats, open_store


def _open(path):
    return xr.open_zarr(path, consolidated=False)


def _check_layout(ds: xr.Dataset) -> None:
    assert np.all(np.diff(ds.latitude.values) > 0), "latitude must ascend"
    lon = ds.longitude.values
    assert np.all(np.diff(lon) > 0), "longitude must ascend"
    if ds.attrs.get("longitude_convention", "0-360") == "0-360":
        assert lon.min() >= 0 and lon.max() < 360
    else:
        assert ds.attrs["grid_kind"] == "regional" and lon.min() > -180 and lon.max() <= 180
    for v in ds.data_vars:
        assert ds[v].dtype == np.float32, v
        assert ds[v].dims[0] == "time" and ds[v].dims[-2:] == ("latitude", "longitude"), ds[v].dims
        assert ds[v].encoding["chunks"][0] == 1
        assert ds[v].encoding["chunks"][1:] == ds[v].shape[1:]


def _grib(path: str) -> xr.Dataset:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return xr.open_dataset(path, engine="cfgrib", backend_kwargs={"indexpath": ""})


@pytest.mark.filterwarnings("ignore::xarray.SerializationWarning")
def test_eraint_netcdf3_packed(run_prepare, tmp_path):
    out = tmp_path / "eraint.zarr"
    run = run_prepare(f"source={ERAINT}", f"out={out}")
    assert run.rc == 0, run.err
    r = run.result
    assert r["store"] == str(out) and r["n_times"] == 2 and r["grid"] == "241x480" and r["n_missing"] == 0
    assert sorted(r["variables"]) == ["geopotential", "u_component_of_wind", "v_component_of_wind"]
    assert r["levels"] == [200, 500, 850]
    ds = _open(out)
    _check_layout(ds)
    assert dict(ds.sizes) == {"time": 2, "level": 3, "latitude": 241, "longitude": 480}
    assert ds.level.values.tolist() == [200, 500, 850]
    # the integer month axis (Jan, Jul) becomes a dated time axis (placeholder year 2000)
    want_t = np.array(["2000-01-01", "2000-07-01"], dtype="datetime64[ns]")
    np.testing.assert_array_equal(ds.time.values, want_t)
    src = xr.open_dataset(ERAINT)
    for short, long in (("z", "geopotential"), ("u", "u_component_of_wind"), ("v", "v_component_of_wind")):
        want = to_store_order(src[short]).astype(np.float32).values
        np.testing.assert_array_equal(ds[long].values, want)
    # spot check one point through the coordinates: (lat 45.0, lon 10.5) in the source
    got = ds.geopotential.sel(level=500, latitude=45.0, longitude=10.5).values
    want = src.z.sel(level=500, latitude=45.0, longitude=10.5).values.astype(np.float32)
    np.testing.assert_array_equal(got, want)
    stats = open_stats(out)
    assert stats.mean.geopotential.dims == ("level",)
    assert stats.climatology.geopotential.dims == ("dayofyear", "hour", "level", "latitude", "longitude")


def test_grib_one_member_and_level(tmp_path):
    out = tmp_path / "m3.zarr"
    r = convert_source(str(MEMBERS), out, variables=["z", "temperature"], levels=[500], member=3)
    assert r.variables == ["geopotential", "temperature"] and r.levels == [500] and r.n_times == 4
    ds = _open(out)
    _check_layout(ds)
    assert dict(ds.sizes) == {"time": 4, "level": 1, "latitude": 61, "longitude": 120}
    assert set(ds.coords) == {"time", "level", "latitude", "longitude"}  # number/step/valid_time dropped
    src = _grib(str(MEMBERS))
    for short, long in (("z", "geopotential"), ("t", "temperature")):
        want = src[short].sel(number=3, isobaricInhPa=500).isel(latitude=slice(None, None, -1)).values
        np.testing.assert_array_equal(ds[long].sel(level=500).values, want)
        other = src[short].sel(number=4, isobaricInhPa=500).isel(latitude=slice(None, None, -1)).values
        assert not np.array_equal(ds[long].sel(level=500).values, other)
    np.testing.assert_array_equal(ds.time.values, src.time.values)


def test_grib_member_mean(tmp_path):
    out = tmp_path / "mean.zarr"
    r = convert_source(str(MEMBERS), out, member="mean")
    assert r.levels == [500, 850]  # ascending, whatever the GRIB order
    ds = _open(out)
    src = _grib(str(MEMBERS))
    want = src.t.astype(np.float64).mean("number").sel(isobaricInhPa=[500, 850])
    want = want.isel(latitude=slice(None, None, -1)).values
    np.testing.assert_allclose(ds.temperature.values, want, rtol=1e-6)
    assert _open(out).attrs["member"] == "mean"


def test_grib_several_hypercubes_are_merged(tmp_path):
    """A GRIB file with pressure-level and surface fields (two cfgrib hypercubes) gives one store."""
    path = tmp_path / "multi.grib"
    with open(MEMBERS, "rb") as f, open(path, "wb") as fout:
        while (h := eccodes.codes_grib_new_from_file(f)) is not None:
            if eccodes.codes_get(h, "number") == 0:
                eccodes.codes_write(h, fout)
                if eccodes.codes_get(h, "shortName") == "t" and eccodes.codes_get(h, "level") == 850:
                    c = eccodes.codes_clone(h)
                    eccodes.codes_set(c, "typeOfLevel", "surface")
                    eccodes.codes_set(c, "paramId", 167)  # 2t
                    eccodes.codes_write(c, fout)
                    eccodes.codes_release(c)
            eccodes.codes_release(h)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert len(cfgrib.open_datasets(str(path), backend_kwargs={"indexpath": ""})) == 2
    out = tmp_path / "multi.zarr"
    r = convert_source(str(path), out)
    assert sorted(r.variables) == ["2m_temperature", "geopotential", "temperature"]
    ds = _open(out)
    assert ds["2m_temperature"].dims == ("time", "latitude", "longitude")
    assert ds["temperature"].dims == ("time", "level", "latitude", "longitude")
    np.testing.assert_array_equal(ds["2m_temperature"].values, ds["temperature"].sel(level=850).values)


def test_zarr_source_short_names_round_trip(tmp_path):
    src = synthetic(n_times=5)
    # WeatherBench 2 zarr stores at low resolution put longitude before latitude
    wb2 = src.transpose("time", "level", "lon", "lat")
    wb2.to_zarr(tmp_path / "src.zarr", zarr_format=2, consolidated=True)
    out = tmp_path / "out.zarr"
    r = convert_source(str(tmp_path / "src.zarr"), out, variables=["z", "t2m"], levels=[850])
    assert r.variables == ["geopotential", "2m_temperature"] and r.levels == [850]
    ds = open_store(out)
    _check_layout(ds)
    assert set(ds.data_vars) == {"geopotential", "2m_temperature"}
    np.testing.assert_array_equal(ds.geopotential.sel(level=850).values,
                                  to_store_order(src.z.sel(level=850)).values)
    np.testing.assert_array_equal(ds["2m_temperature"].values, to_store_order(src.t2m).values)
    # the store itself is a valid source again (long names, trajectory-free)
    again = tmp_path / "again.zarr"
    convert_source(str(out), again)
    np.testing.assert_array_equal(_open(again).geopotential.values, ds.geopotential.values)


def test_regional_netcdf4_grid_crossing_greenwich(tmp_path):
    src = synthetic(n_times=4, nlat=7, nlon=11, lon_start=-20.0)
    src = src.assign_coords(lat=np.linspace(60, 30, 7), lon=-20.0 + 5.0 * np.arange(11))  # 30..60N, 20W..30E
    path = tmp_path / "region.nc"
    src.to_netcdf(path, engine="netcdf4", format="NETCDF4")
    out = tmp_path / "region.zarr"
    r = convert_source(str(path), out)
    assert r.grid == (7, 11)
    ds = open_store(out)
    _check_layout(ds)
    assert ds.latitude.values.tolist() == [30.0, 35.0, 40.0, 45.0, 50.0, 55.0, 60.0]
    # the box stays in one piece: no seam between 30 E and 340 E inside the grid
    assert ds.longitude.values.tolist() == [-20, -15, -10, -5, 0, 5, 10, 15, 20, 25, 30]
    assert ds.attrs["grid_kind"] == "regional" and ds.attrs["longitude_convention"] == "-180-180"
    np.testing.assert_array_equal(ds.temperature.values, src.t.sortby("lat").values)


def test_glob_of_files_split_by_time_and_variable(tmp_path):
    src = synthetic(n_times=8)
    src.isel(time=slice(4, 8))[["z", "t"]].to_netcdf(tmp_path / "b_levels.nc")
    src.isel(time=slice(4, 8))[["t2m"]].to_netcdf(tmp_path / "b_surface.nc")
    src.isel(time=slice(0, 4)).to_netcdf(tmp_path / "a_all.nc")
    out = tmp_path / "glob.zarr"
    r = convert_source(str(tmp_path / "*.nc"), out)
    assert r.n_times == 8
    ds = open_store(out)
    np.testing.assert_array_equal(ds.time.values, src.time.values)
    np.testing.assert_array_equal(ds.temperature.values, to_store_order(src.t).values)
    np.testing.assert_array_equal(ds["2m_temperature"].values, to_store_order(src.t2m).values)


def test_forecast_step_dimension_becomes_valid_time(tmp_path):
    base = synthetic(n_times=2, freq="12h")[["t2m"]]
    steps = pd.to_timedelta([0, 6], unit="h")
    ds = xr.concat([base, base + 1.0], dim=pd.Index(steps, name="step"))
    ds = ds.transpose("time", "step", "lat", "lon")
    ds = ds.assign_coords(valid_time=ds.time + ds.step)
    ds.to_zarr(tmp_path / "fc.zarr", zarr_format=3, consolidated=False)
    out = tmp_path / "fc_out.zarr"
    r = convert_source(str(tmp_path / "fc.zarr"), out)
    assert r.n_times == 4
    got = open_store(out)
    want_t = np.array(["2020-01-01T00", "2020-01-01T06", "2020-01-01T12", "2020-01-01T18"],
                      dtype="datetime64[ns]")
    np.testing.assert_array_equal(got.time.values, want_t)
    np.testing.assert_array_equal(got["2m_temperature"].isel(time=1).values,
                                  to_store_order(base.t2m.isel(time=0)).values + np.float32(1.0))


def test_existing_store_is_not_overwritten_without_overwrite(run_prepare, tmp_path):
    out = tmp_path / "keep.zarr"
    convert_source(str(MEMBERS), out, member=0, variables=["t"])
    before = _open(out).temperature.values
    run = run_prepare(f"source={MEMBERS}", f"out={out}", "member=1")
    assert run.rc == 2 and "already exists" in run.errors[0] and "overwrite=true" in run.errors[0]
    np.testing.assert_array_equal(_open(out).temperature.values, before)
    run = run_prepare(f"source={MEMBERS}", f"out={out}", "member=1", "overwrite=true", "variables=[t]")
    assert run.rc == 0, run.err
    assert not np.array_equal(_open(out).temperature.values, before)


@pytest.mark.parametrize("member, needle", [(None, "set member="), (12, "no ensemble member 12")])
def test_members_must_be_chosen_from_those_present(run_prepare, tmp_path, member, needle):
    out = tmp_path / "m.zarr"
    extra = [f"member={member}"] if member is not None else []
    run = run_prepare(f"source={MEMBERS}", f"out={out}", *extra)
    assert_failed_cleanly(run, out, str(MEMBERS), needle)


def test_cds_netcdf4_layout(tmp_path):
    """New CDS netCDF: valid_time / pressure_level dims, scalar number, expver along time."""
    src = synthetic(n_times=3, levels=(850, 500))[["z"]]
    src = src.rename(time="valid_time", level="pressure_level", lat="latitude", lon="longitude")
    src = src.assign_coords(number=0, expver=("valid_time", ["0001"] * 3))
    src.pressure_level.attrs["units"] = "hPa"
    path = tmp_path / "cds.nc"
    src.to_netcdf(path, engine="netcdf4")
    out = tmp_path / "cds.zarr"
    r = convert_source(str(path), out)
    assert r.variables == ["geopotential"] and r.levels == [500, 850]
    ds = open_store(out)
    assert set(ds.coords) == {"time", "level", "latitude", "longitude"}
    np.testing.assert_array_equal(ds.time.values, src.valid_time.values)
    want = to_store_order(src.z.rename(latitude="lat", longitude="lon").sel(pressure_level=[500, 850]))
    np.testing.assert_array_equal(ds.geopotential.values, want.values)


def test_constant_fields_are_stored_without_time(tmp_path, monkeypatch):
    monkeypatch.setattr(writer, "BLOCK_BYTES", 1)  # constants go with the first block, later ones append
    src = synthetic(n_times=4)[["t2m"]]
    lsm = (src.t2m > 280).astype(np.float32)  # ERA5 GRIB/netCDF carry lsm with a time axis
    src["lsm"] = lsm.isel(time=0).expand_dims(time=src.time).transpose("time", "lat", "lon")
    src["z"] = (src["lsm"] * 1000.0).astype(np.float32)  # single-level `z`: the surface geopotential
    path = tmp_path / "with_lsm.nc"
    src.to_netcdf(path)
    out = tmp_path / "lsm.zarr"
    r = convert_source(str(path), out)
    assert sorted(r.variables) == ["2m_temperature", "geopotential_at_surface", "land_sea_mask"]
    assert r.n_times == 4
    ds = open_store(out)
    assert ds.land_sea_mask.dims == ("latitude", "longitude")
    assert ds.geopotential_at_surface.dims == ("latitude", "longitude")
    want = to_store_order(lsm.isel(time=0)).values
    np.testing.assert_array_equal(ds.land_sea_mask.values, want)
    np.testing.assert_array_equal(ds["2m_temperature"].values, to_store_order(src.t2m).values)
    stats = open_stats(out)
    np.testing.assert_allclose(stats.mean.land_sea_mask.values, want.astype(np.float64).mean(), rtol=1e-6)
    assert float(stats.diff_std.land_sea_mask.values) == 0.0
    np.testing.assert_array_equal(stats.climatology.land_sea_mask.values, want)
