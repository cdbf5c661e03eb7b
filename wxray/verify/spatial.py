"""Latitude weights and the one spatial mean every score goes through (WeatherBench 2 conventions).

Grids may be global or regional and longitudes in either convention ([0, 360) or (-180, 180], see
`wxray.data.schema`): region masks compare longitudes modulo 360, and a regional grid's edge rows are
cells of one grid spacing, not stretched to the poles.

A field too large for memory is scored in latitude bands (`Band`): a band's "mean" is its two parts, the
weighted sum and the weight (dim `part`), with the whole grid's weights cut to its rows, so that

    spatial mean = sum over bands of the sums / sum over bands of the weights       (`from_parts`)

equals the whole grid's `spatial_mean` (to rounding) for any score that is a mean of pointwise values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import xarray as xr

from wxray.data.schema import LAT, LON
from wxray.errors import ConfigError, DataError

SPATIAL_DIMS = (LAT, LON)


def latitude_weights(latitude: xr.DataArray | np.ndarray) -> xr.DataArray:
    """Cell-area weights from latitude bounds, normalised to mean 1 (WeatherBench 2 `get_lat_weights`).

    Bounds are the midpoints between grid latitudes, closed by the poles, so a global grid's raw
    weights (sin(upper) - sin(lower)) sum to 2, the area of the unit sphere over 2*pi. Cosine weights
    would give the pole rows of an equiangular grid zero weight although their cells have area.
    An outer row further than one grid spacing from its pole (a regional grid, e.g. 30..60 N) is closed
    half a spacing beyond it instead, so its cell is not stretched to the pole.
    """
    lat = latitude if isinstance(latitude, xr.DataArray) else xr.DataArray(np.asarray(latitude), dims=[LAT])
    values = np.deg2rad(np.asarray(lat.values, dtype=np.float64))
    if values.ndim != 1 or values.size == 0:
        raise DataError("latitude must be a non-empty 1-d coordinate")
    if values.size > 1 and not np.all(np.diff(values) > 0):
        raise DataError("latitude must be strictly ascending (south to north) for latitude weights")
    if np.any(np.abs(values) > np.pi / 2 + 1e-9):
        raise DataError("latitude values must lie in [-90, 90] degrees")
    if values.size == 1:
        return xr.DataArray(np.ones(1), dims=[LAT], coords={LAT: lat.values}, name="latitude_weights")
    d_south, d_north = values[1] - values[0], values[-1] - values[-2]
    south = -np.pi / 2 if values[0] - d_south <= -np.pi / 2 + 1e-9 else values[0] - d_south / 2
    north = np.pi / 2 if values[-1] + d_north >= np.pi / 2 - 1e-9 else values[-1] + d_north / 2
    bounds = np.concatenate([[south], (values[:-1] + values[1:]) / 2, [north]])
    area = np.sin(bounds[1:]) - np.sin(bounds[:-1])
    return xr.DataArray(area / area.mean(), dims=[LAT], coords={LAT: lat.values}, name="latitude_weights")


@dataclass(frozen=True)
class Region:
    """A latitude band and longitude range, eastwards from lon_min to lon_max (degrees E, either
    convention: (347.5, 42.5) and (-12.5, 42.5) are the same box through the Greenwich meridian).
    A grid's longitudes are compared modulo 360, so [0, 360) and (-180, 180] grids give the same mask."""

    name: str
    lat_min: float = -90.0
    lat_max: float = 90.0
    lon_min: float = 0.0
    lon_max: float = 360.0
    abs_lat_min: float = 0.0  # e.g. 20 for "extratropics": both hemispheres poleward of 20 degrees

    def mask(self, latitude: xr.DataArray, longitude: xr.DataArray) -> xr.DataArray:
        lon = longitude % 360
        in_lat = (latitude >= self.lat_min) & (latitude <= self.lat_max) & (abs(latitude) >= self.abs_lat_min)
        west, east = self.lon_min % 360, self.lon_max % 360
        if self.lon_max - self.lon_min >= 360:
            in_lon = lon >= 0  # every meridian
        elif west <= east:
            in_lon = (lon >= west) & (lon <= east)
        else:
            in_lon = (lon >= west) | (lon <= east)
        return in_lat & in_lon


# WeatherBench 2 region definitions (longitudes in [0, 360)); RegionName lists their keys, in order, for configs.
RegionName = Literal["global", "tropics", "extratropics", "northern_extratropics", "southern_extratropics",
                     "europe", "north_america"]
REGIONS: dict[str, Region] = {
    "global": Region("global"),
    "tropics": Region("tropics", -20, 20),
    "extratropics": Region("extratropics", abs_lat_min=20),
    "northern_extratropics": Region("northern_extratropics", 20, 90),
    "southern_extratropics": Region("southern_extratropics", -90, -20),
    "europe": Region("europe", 35, 75, 347.5, 42.5),
    "north_america": Region("north_america", 25, 60, 240, 295),
}


def region_mask(region: str | Region | xr.DataArray | None, latitude: xr.DataArray,
                longitude: xr.DataArray) -> xr.DataArray | None:
    """Boolean (latitude, longitude) mask, or None for the whole grid."""
    if region is None:
        return None
    if isinstance(region, xr.DataArray):
        if set(region.dims) - set(SPATIAL_DIMS):
            raise DataError(f"region mask must have dims (latitude, longitude), got {region.dims}")
        return region.astype(bool)
    if isinstance(region, str):
        if region not in REGIONS:
            raise ConfigError(f"unknown region '{region}' (known: {', '.join(REGIONS)})")
        if region == "global":
            return None
        region = REGIONS[region]
    mask = region.mask(latitude, longitude)
    if not bool(mask.any()):
        raise DataError(f"region '{region.name}' contains no grid points")
    return mask


def spatial_weights(latitude: xr.DataArray, longitude: xr.DataArray,
                    region: str | Region | xr.DataArray | None = None) -> xr.DataArray:
    """(latitude, longitude) weights of `spatial_mean`: latitude weights, 0 outside the region."""
    weights = latitude_weights(latitude) * xr.ones_like(longitude, dtype=np.float64)
    mask = region_mask(region, latitude, longitude)
    return weights if mask is None else weights.where(mask, 0.0)


PART = "part"  # the dim of a band's two parts of a spatial mean
PARTS = ("sum", "weight")


@dataclass(frozen=True, eq=False)
class Band:
    """Rows of a larger grid scored on their own, as a region: `weights` are the whole grid's
    (`spatial_weights`, region mask included) at these rows, so a band's sums add up to the grid's."""

    weights: xr.DataArray

    @classmethod
    def of(cls, latitude: xr.DataArray, longitude: xr.DataArray, region, rows: slice) -> Band:
        return cls(spatial_weights(latitude, longitude, region).isel({LAT: rows}))


def from_parts(parts: xr.DataArray) -> xr.DataArray:
    """The spatial mean from the `part` dim (summed over bands first): sum / weight, NaN where no weight."""
    total, weight = (parts.sel({PART: p}, drop=True) for p in PARTS)
    return total / weight.where(weight > 0)


def spatial_mean(da: xr.DataArray, region: str | Region | xr.DataArray | Band | None = None,
                 skipna: bool = False) -> xr.DataArray:
    """Latitude-weighted mean over (latitude, longitude), optionally restricted to a region.

    With skipna the weights are renormalised over the valid points of each field, so a missing point
    neither counts as zero nor biases the mean towards the other latitudes; a field with no valid point
    gives NaN. Without skipna a NaN anywhere in a field makes that field's mean NaN.
    With a `Band` as the region: the weighted sum and the weight along a first dim `part` (`from_parts`).
    """
    missing = [d for d in SPATIAL_DIMS if d not in da.dims]
    if missing:
        raise DataError(f"{da.name or 'field'}: missing spatial dimension(s) {missing} (dims: {da.dims})")
    band = isinstance(region, Band)
    weights = region.weights if band else spatial_weights(da[LAT], da[LON], region)
    if skipna:
        valid = da.notnull()
        w = weights.where(valid, 0.0)
        total, weight = (da.fillna(0.0) * w).sum(SPATIAL_DIMS), w.sum(SPATIAL_DIMS)
        if not band:
            return (total / weight.where(weight > 0)).rename(da.name)
    else:
        total, weight = (da * weights).sum(SPATIAL_DIMS, skipna=False), weights.sum(SPATIAL_DIMS)
        if not band:
            return (total / weight).rename(da.name)
    weight = weight * xr.ones_like(total)  # without skipna the same weight for every field of the band
    return xr.concat([total, weight], dim=PART).assign_coords({PART: list(PARTS)}).rename(da.name)
