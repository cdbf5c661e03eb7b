"""CF attributes on what wxray writes (wxray.data.cf): added where missing, never over a source's own."""

from __future__ import annotations

import numpy as np
import pandas as pd
import xarray as xr

from wxray.data.cf import describe


def test_describe_adds_cf_attributes_and_keeps_the_sources():
    ds = xr.Dataset({"2m_temperature": (("init_time", "lead_time", "latitude", "longitude"), np.zeros((1, 2, 3, 4)),
                                        {"units": "K"}),
                     "my_field": (("latitude", "longitude"), np.zeros((3, 4)), {"long_name": "mine"})},
                    coords={"init_time": pd.to_datetime(["2020-01-01"]), "lead_time": pd.to_timedelta([6, 12], "h"),
                            "latitude": ("latitude", [-10.0, 0.0, 10.0], {"units": "degrees_N"}),
                            "longitude": [0.0, 90.0, 180.0, 270.0]}, attrs={"source": "test"})
    out = describe(ds)
    assert out.attrs == {"Conventions": "CF-1.8", "source": "test"}
    assert out.latitude.attrs["units"] == "degrees_N" and out.latitude.attrs["axis"] == "Y"  # the source's kept
    assert out.longitude.attrs == {"units": "degrees_east", "standard_name": "longitude", "long_name": "longitude",
                                   "axis": "X"}
    assert out.init_time.attrs["standard_name"] == "forecast_reference_time"
    assert out["2m_temperature"].attrs == {"long_name": "2 metre temperature", "standard_name": "air_temperature",
                                           "units": "K"}
    assert out["my_field"].attrs == {"long_name": "mine"}
    assert ds.longitude.attrs == {} and "Conventions" not in ds.attrs  # the input is left as it was


def test_described_forecast_round_trips_through_zarr(tmp_path):
    ds = xr.Dataset({"geopotential": (("lead_time", "level", "latitude", "longitude"), np.ones((2, 1, 2, 2)))},
                    coords={"lead_time": pd.to_timedelta([6, 12], "h"), "level": [500],
                            "latitude": [0.0, 1.0], "longitude": [0.0, 1.0]})
    describe(ds).to_zarr(tmp_path / "f.zarr", zarr_format=2, consolidated=True)
    back = xr.open_zarr(tmp_path / "f.zarr")
    assert back.lead_time.dtype.kind == "m" and back.level.attrs["positive"] == "down"
    assert back.geopotential.attrs["standard_name"] == "geopotential"
