"""CF metadata on what wxray writes (forecast.zarr of every forecasting job), so that tools that read CF
(ncview, Panoply, cf-xarray, cartopy's axis guessing, MetPy) know the axes and the fields.

`describe(ds)` adds, where a value is not already set (a source's own attributes win):
* `latitude` / `longitude`: units degrees_north / degrees_east, standard_name, long_name, axis Y / X;
  `level`: pressure level in hPa (axis Z, positive down); `init_time` / `lead_time`: standard names
  forecast_reference_time / forecast_period (their units are the zarr time encoding's, not attributes);
  the ensemble dims (`member`, `encoder_draw`, `dropout_draw`, `routing_draw`) a long_name;
* each WeatherBench 2 / ERA5 variable its long_name (and standard_name where CF has one);
* the dataset `Conventions: CF-1.8`.
"""

from __future__ import annotations

import xarray as xr

CONVENTIONS = "CF-1.8"
COORDS = {
    "latitude": {"units": "degrees_north", "standard_name": "latitude", "long_name": "latitude", "axis": "Y"},
    "longitude": {"units": "degrees_east", "standard_name": "longitude", "long_name": "longitude", "axis": "X"},
    "level": {"units": "hPa", "standard_name": "air_pressure", "long_name": "pressure level", "axis": "Z",
              "positive": "down"},
    "init_time": {"standard_name": "forecast_reference_time", "long_name": "initialisation time"},
    "lead_time": {"standard_name": "forecast_period", "long_name": "lead time"},
    "time": {"standard_name": "time", "long_name": "time", "axis": "T"},
    "member": {"long_name": "ensemble member"},
    "encoder_draw": {"long_name": "draw of the stochastic encoder (observation uncertainty)"},
    "dropout_draw": {"long_name": "draw of the processor's MC dropout (model uncertainty)"},
    "routing_draw": {"long_name": "draw of the processor's token routing"},
}
# (long_name, standard_name or "") of WeatherBench 2 / ARCO-ERA5 variables
VARIABLES = {
    "2m_temperature": ("2 metre temperature", "air_temperature"),
    "2m_dewpoint_temperature": ("2 metre dewpoint temperature", "dew_point_temperature"),
    "10m_u_component_of_wind": ("10 metre U wind component", "eastward_wind"),
    "10m_v_component_of_wind": ("10 metre V wind component", "northward_wind"),
    "mean_sea_level_pressure": ("mean sea level pressure", "air_pressure_at_mean_sea_level"),
    "surface_pressure": ("surface pressure", "surface_air_pressure"),
    "total_precipitation_6hr": ("total precipitation (6 h accumulation)", "precipitation_amount"),
    "total_column_water_vapour": ("total column water vapour", "atmosphere_mass_content_of_water_vapor"),
    "geopotential": ("geopotential", "geopotential"),
    "temperature": ("temperature", "air_temperature"),
    "u_component_of_wind": ("U component of wind", "eastward_wind"),
    "v_component_of_wind": ("V component of wind", "northward_wind"),
    "vertical_velocity": ("vertical velocity", "lagrangian_tendency_of_air_pressure"),
    "specific_humidity": ("specific humidity", "specific_humidity"),
    "relative_humidity": ("relative humidity", "relative_humidity"),
    "vorticity": ("relative vorticity", "atmosphere_relative_vorticity"),
    "divergence": ("divergence", "divergence_of_wind"),
    "geopotential_at_surface": ("geopotential at the surface", "surface_geopotential"),
    "land_sea_mask": ("land-sea mask", "land_binary_mask"),
}


def describe(ds: xr.Dataset) -> xr.Dataset:
    """`ds` with the CF attributes of the module docstring added where missing (a shallow copy)."""
    ds = ds.copy()
    for name, attrs in COORDS.items():
        if name in ds.coords:
            ds[name].attrs = {**attrs, **ds[name].attrs}
    for name in ds.data_vars:
        long_name, standard = VARIABLES.get(str(name), (str(name).replace("_", " "), ""))
        extra = {"long_name": long_name, **({"standard_name": standard} if standard else {})}
        ds[name].attrs = {**extra, **ds[name].attrs}
    ds.attrs = {"Conventions": CONVENTIONS, **ds.attrs}
    return ds
