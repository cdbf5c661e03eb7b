"""Deterministic scores, one value per field (spatial mean over latitude/longitude, other dims kept).

As in WeatherBench 2 each score is computed per initialisation first; aggregation over initialisations
(and the bootstrap of that aggregation) is the caller's job, so nonlinear aggregates such as RMSE are
formed as sqrt(mean over inits of the per-init MSE), never as a mean of per-init RMSEs.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import xarray as xr

from wxray.data.schema import GLOBAL, LAT, LON, grid_kind
from wxray.errors import DataError
from wxray.verify.spatial import Region, spatial_mean

RegionLike = str | Region | xr.DataArray | None


def _paired(forecast: xr.DataArray, truth: xr.DataArray, skipna: bool) -> tuple[xr.DataArray, xr.DataArray]:
    # A point missing in either field is dropped from both, so every score sees the same points.
    if not skipna:
        return forecast, truth
    valid = forecast.notnull() & truth.notnull()
    return forecast.where(valid), truth.where(valid)


def mse(forecast: xr.DataArray, truth: xr.DataArray, region: RegionLike = None,
        skipna: bool = False) -> xr.DataArray:
    f, t = _paired(forecast, truth, skipna)
    return spatial_mean((f - t) ** 2, region, skipna).rename("mse")


def rmse(forecast: xr.DataArray, truth: xr.DataArray, time_dims: Sequence[str] = (),
         region: RegionLike = None, skipna: bool = False) -> xr.DataArray:
    """sqrt of the MSE averaged over `time_dims` (WeatherBench 2 `RMSE`, time mean before the root)."""
    per_field = mse(forecast, truth, region, skipna)
    return np.sqrt(per_field.mean(list(time_dims), skipna=skipna)).rename("rmse")


def bias(forecast: xr.DataArray, truth: xr.DataArray, region: RegionLike = None,
         skipna: bool = False) -> xr.DataArray:
    """Mean error forecast - truth (positive: forecast too high)."""
    f, t = _paired(forecast, truth, skipna)
    return spatial_mean(f - t, region, skipna).rename("bias")


def mae(forecast: xr.DataArray, truth: xr.DataArray, region: RegionLike = None,
        skipna: bool = False) -> xr.DataArray:
    f, t = _paired(forecast, truth, skipna)
    return spatial_mean(abs(f - t), region, skipna).rename("mae")


def climatology_at(climatology: xr.DataArray, valid_time: xr.DataArray) -> xr.DataArray:
    """The day-of-year x hour climatology at each valid time (`valid_time`'s dims replace the lookup dims)."""
    index = {"dayofyear": valid_time.dt.dayofyear}
    if "hour" in climatology.dims:
        index["hour"] = valid_time.dt.hour
    for dim, wanted in index.items():
        have = set(np.asarray(climatology[dim].values).tolist()) if dim in climatology.coords else set()
        missing = sorted(set(np.unique(wanted.values).tolist()) - have)
        if missing:
            raise DataError(f"climatology '{climatology.name}': no {dim} {missing[:5]} "
                            f"(has {len(have)} values of {dim})")
    out = climatology.sel(index)
    return out.drop_vars([d for d in index if d in out.coords])


def acc(forecast: xr.DataArray, truth: xr.DataArray, climatology: xr.DataArray,
        region: RegionLike = None, skipna: bool = False) -> xr.DataArray:
    """Anomaly correlation coefficient per field (WeatherBench 2 `ACC`: uncentred, latitude-weighted).

    `climatology` must already be aligned with the fields (see `climatology_at`).
    """
    f, t = _paired(forecast - climatology, truth - climatology, skipna)
    num = spatial_mean(f * t, region, skipna)
    den = np.sqrt(spatial_mean(f**2, region, skipna) * spatial_mean(t**2, region, skipna))
    return (num / den).rename("acc")


def _ssim_map(x: np.ndarray, y: np.ndarray, sigma: float, k1: float, k2: float,
              periodic: bool = True) -> np.ndarray:
    # Gaussian window of Wang et al. (2004) (sigma 1.5 cells, 11x11 support); latitude edges are
    # clamped; longitude is periodic on a global grid (no seam at 0 degrees) and clamped like latitude
    # on a regional one, whose west and east edges are not neighbours.
    mode = ("nearest", "wrap" if periodic else "nearest")

    # loaded here, not with the module: every training worker imports the scores' registry, none computes SSIM
    from scipy.ndimage import gaussian_filter

    def smooth(a: np.ndarray) -> np.ndarray:
        return gaussian_filter(a, sigma=sigma, mode=mode, truncate=3.5, axes=(-2, -1))

    with warnings.catch_warnings():  # a field with no valid point (skipna) has no range: 1.0 below
        warnings.simplefilter("ignore", RuntimeWarning)
        data_range = np.nanmax(y, axis=(-2, -1), keepdims=True) - np.nanmin(y, axis=(-2, -1), keepdims=True)
    data_range = np.where(data_range > 0, data_range, 1.0)
    c1, c2 = (k1 * data_range) ** 2, (k2 * data_range) ** 2
    mx, my = smooth(x), smooth(y)
    vx = smooth(x * x) - mx**2
    vy = smooth(y * y) - my**2
    cxy = smooth(x * y) - mx * my
    return ((2 * mx * my + c1) * (2 * cxy + c2)) / ((mx**2 + my**2 + c1) * (vx + vy + c2))


def ssim(forecast: xr.DataArray, truth: xr.DataArray, region: RegionLike = None, skipna: bool = False,
         sigma: float = 1.5, k1: float = 0.01, k2: float = 0.03) -> xr.DataArray:
    """Structural similarity (Wang et al. 2004) of each lat-lon field with its truth, spatially averaged.

    The dynamic range L of the constants C1=(k1 L)^2, C2=(k2 L)^2 is the truth field's own range, as
    physical fields have no fixed range like 8-bit images. Near a missing point the window is NaN.
    The window wraps around in longitude only on a global grid (`wxray.data.schema.grid_kind`).
    """
    # The filter needs whole fields in memory; callers hand in one lead at a time.
    f, t = (a.compute() for a in xr.broadcast(*_paired(forecast, truth, skipna)))
    periodic = LON not in t.coords or grid_kind(t[LON].values) == GLOBAL
    smap = xr.apply_ufunc(
        _ssim_map, f.astype(np.float64), t.astype(np.float64),
        kwargs={"sigma": sigma, "k1": k1, "k2": k2, "periodic": periodic},
        input_core_dims=[[LAT, LON], [LAT, LON]], output_core_dims=[[LAT, LON]], dask="forbidden",
    )
    return spatial_mean(smap, region, skipna).rename("ssim")
