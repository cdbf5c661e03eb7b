"""Latitude weights (WeatherBench 2 definition) and the one spatial-mean helper."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from wxray.errors import ConfigError, DataError
from wxray.verify.spatial import latitude_weights, region_mask, spatial_mean


def _field(values, lat, lon):
    return xr.DataArray(values, dims=("latitude", "longitude"), coords={"latitude": lat, "longitude": lon})


def test_latitude_weights_equiangular_grid_with_poles():
    lat = np.linspace(-90, 90, 61)  # the 3-degree ERA5 grid, poles included
    w = latitude_weights(lat)
    assert w.dims == ("latitude",) and w.shape == (61,)
    assert np.isclose(float(w.mean()), 1.0, rtol=1e-12) and np.isclose(float(w.sum()), 61.0, rtol=1e-12)
    # Independent derivation of the cell areas: an interior cell spans lat +- 1.5 deg, a pole cell
    # spans 88.5..90 deg; the areas of the whole sphere's cells sum to 2 (over 2 pi).
    half = np.deg2rad(1.5)
    area = 2 * np.cos(np.deg2rad(lat)) * np.sin(half)
    area[0] = area[-1] = 1 - np.sin(np.pi / 2 - half)
    assert np.isclose(area.sum(), 2.0, rtol=1e-12)
    np.testing.assert_allclose(w.values, area / area.mean(), rtol=1e-12)
    assert w.values[0] > 0 and np.allclose(w.values, w.values[::-1])


def test_latitude_weights_reject_descending_latitude():
    with pytest.raises(DataError, match="ascending"):
        latitude_weights(np.linspace(90, -90, 61))


def test_spatial_mean_is_area_weighted():
    lat = np.linspace(-90, 90, 61)
    lon = np.arange(0, 360, 3.0)
    north = _field(np.broadcast_to((lat > 0)[:, None], (61, 120)).astype(float), lat, lon)
    # Exactly half of the sphere's area lies north of the equator row's upper bound plus half the row.
    assert float(spatial_mean(north)) == pytest.approx(0.5 - 0.5 * float(latitude_weights(lat)[30]) / 61)
    constant = xr.full_like(north, 7.5)
    assert float(spatial_mean(constant)) == pytest.approx(7.5, rel=1e-12)
    sin_lat = _field(np.broadcast_to(np.sin(np.deg2rad(lat))[:, None], (61, 120)), lat, lon)
    assert abs(float(spatial_mean(sin_lat))) < 1e-12


def test_spatial_mean_region_and_skipna():
    lat = np.linspace(-90, 90, 61)
    lon = np.arange(0, 360, 3.0)
    lat_da = xr.DataArray(lat, dims="latitude", coords={"latitude": lat})
    lon_da = xr.DataArray(lon, dims="longitude", coords={"longitude": lon})
    tropics = region_mask("tropics", lat_da, lon_da)
    inside = _field(np.where(tropics, 1.0, 100.0), lat, lon)
    assert float(spatial_mean(inside, region="tropics")) == pytest.approx(1.0)
    assert float(spatial_mean(inside)) > 1.0
    europe = region_mask("europe", lat_da, lon_da)
    assert bool(europe.sel(latitude=51, longitude=0, method="nearest"))  # wraps through Greenwich
    assert not bool(europe.sel(latitude=51, longitude=180, method="nearest"))
    field = _field(np.full((61, 120), 3.0), lat, lon)
    field[10, 10] = np.nan
    assert np.isnan(float(spatial_mean(field)))
    assert float(spatial_mean(field, skipna=True)) == pytest.approx(3.0, rel=1e-12)
    with pytest.raises(ConfigError, match="unknown region"):
        spatial_mean(field, region="atlantis")


def test_the_region_config_type_lists_exactly_the_regions():
    from typing import get_args, get_type_hints

    from wxray.verify.evaluate import EvaluateConfig
    from wxray.verify.spatial import REGIONS, RegionName

    assert get_args(RegionName) == tuple(REGIONS)  # same names, same order (the config error lists them)
    assert get_type_hints(EvaluateConfig)["region"] == RegionName
