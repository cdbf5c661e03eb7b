"""Forecast convention: persistence, truth lookup at init + lead, grids, real ERA5 GRIB as a forecast."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from tests.verify.conftest import ERA5_MEMBERS
from wxray.data.schema import open_store
from wxray.errors import DataError
from wxray.verify.forecasts import check_grid, open_forecast, open_truth, persistence_forecast, regrid_like, truth_at


def test_persistence_forecast_follows_the_convention(store):
    ds = open_store(store)
    inits = ds.time.values[[0, 3, 5]]
    fc = persistence_forecast(ds, inits, [0, 6, 24])
    assert fc["geopotential"].dims == ("init_time", "lead_time", "level", "latitude", "longitude")
    assert fc["2m_temperature"].dims == ("init_time", "lead_time", "latitude", "longitude")
    assert "land_sea_mask" not in fc  # constants have no time and are not forecast
    np.testing.assert_array_equal(fc.lead_time.values, np.array([0, 6, 24], dtype="timedelta64[h]"))
    for lead in fc.lead_time.values:
        np.testing.assert_array_equal(fc["geopotential"].sel(lead_time=lead).values,
                                      ds["geopotential"].sel(time=inits).values)
    with pytest.raises(DataError, match="not in the store"):
        persistence_forecast(ds, [np.datetime64("1999-01-01")], [6])


def test_truth_is_looked_up_at_init_plus_lead(store):
    ds = open_store(store)
    inits = ds.time.values[:4]
    t = truth_at(ds["2m_temperature"], inits, np.timedelta64(12, "h"), "2m_temperature")
    assert t.dims[0] == "init_time" and np.array_equal(t.init_time.values, inits)
    np.testing.assert_array_equal(t.values, ds["2m_temperature"].isel(time=slice(2, 6)).values)
    last = ds.time.values[-3:]
    with pytest.raises(DataError, match="no truth at lead 24 h for 3 of 3"):
        truth_at(ds["2m_temperature"], last, np.timedelta64(24, "h"), "forecast f.zarr '2m_temperature'")


def test_grid_mismatch_is_an_error_unless_regridding():
    lat_c, lon_c = np.linspace(-90, 90, 61), np.arange(0, 360, 3.0)
    lat_f, lon_f = np.linspace(-90, 90, 241), np.arange(0, 360, 0.75)

    def field(lat, lon):
        return xr.Dataset({"t": (("latitude", "longitude"),
                                 np.cos(np.deg2rad(lat))[:, None] * np.cos(np.deg2rad(lon))[None])},
                          coords={"latitude": lat, "longitude": lon})

    coarse, fine = field(lat_c, lon_c), field(lat_f, lon_f)
    with pytest.raises(DataError, match="regrid=true"):
        check_grid(coarse, fine, "forecast f.zarr", regrid=False)
    out = check_grid(coarse, fine, "forecast f.zarr", regrid=True)
    assert out.sizes == fine.sizes
    # Linear interpolation error of a 3-degree cosine is < 1e-3, including across the 357..360 gap.
    np.testing.assert_allclose(out["t"].values, fine["t"].values, atol=1e-3)
    gap = regrid_like(coarse, fine)["t"].sel(longitude=359.25)
    assert np.isfinite(gap).all()


def test_era5_grib_members_open_as_a_forecast_and_as_truth():
    fc = open_forecast(ERA5_MEMBERS)
    assert fc["geopotential"].dims == ("init_time", "lead_time", "member", "level", "latitude", "longitude")
    assert fc.sizes["member"] == 10 and fc.sizes["lead_time"] == 1
    assert np.all(np.diff(fc.latitude.values) > 0) and fc.lead_time.values[0] == np.timedelta64(0)
    assert sorted(fc.level.values.tolist()) == [500, 850]
    truth, clim = open_truth(ERA5_MEMBERS, member="3")
    assert "member" not in truth.dims and clim is None
    np.testing.assert_array_equal(truth["temperature"].values,
                                  fc["temperature"].isel(member=3, lead_time=0).rename(init_time="time").values)
    with pytest.raises(DataError, match="truth_member=mean"):
        open_truth(ERA5_MEMBERS)
    assert pd.DatetimeIndex(truth.time.values)[0] == pd.Timestamp("2017-01-01")


def test_an_unreadable_zarr_is_a_one_line_error_with_the_first_line_of_the_cause(tmp_path, monkeypatch):
    bad = tmp_path / "bad.zarr"
    bad.mkdir()
    (bad / "zarr.json").write_text('{"zarr_format": 3, "node_type":\n"group"')  # truncated metadata
    with pytest.raises(DataError) as err:
        open_forecast(bad)
    assert str(err.value).startswith(f"forecast {bad} cannot be read (JSONDecodeError: ")
    assert "\n" not in str(err.value)

    def fail(*args, **kwargs):
        raise ValueError("codec pipeline failed\n  detail on a second line\n")

    monkeypatch.setattr(xr, "open_zarr", fail)
    with pytest.raises(DataError) as err:
        open_forecast(bad, "baseline")
    assert str(err.value) == f"baseline {bad} cannot be read (ValueError: codec pipeline failed)"
