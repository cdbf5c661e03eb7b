"""The wxray store: WeatherBench 2 conventions, one place that defines them.

A store is a zarr v3 group holding an xarray Dataset:

* dims ``time``, optional ``level`` (hPa, int), ``latitude`` (degrees, **ascending: south to north**,
  as in the WeatherBench 2 zarr stores), ``longitude`` (degrees in [0, 360), ascending);
* data variables with long ERA5 / WeatherBench 2 names (``geopotential``, ``temperature``,
  ``2m_temperature``, ``10m_u_component_of_wind``, ...), float32, dims (time, [level,] latitude, longitude),
  chunked one time step per chunk;
* constant fields (``land_sea_mask``, ``geopotential_at_surface``) with dims (latitude, longitude);
* an optional ``trajectory`` coordinate on ``time`` (int): samples never form a window across two
  trajectories (the shallow-water sample has several independent runs laid end to end);
* a ``stats`` sub-group with one Dataset per statistic, each holding the same variable names:
  ``stats/mean``, ``stats/std`` (dims () or (level,)), ``stats/diff_mean``, ``stats/diff_std`` (of the
  difference between consecutive time steps, for residual targets), and ``stats/climatology`` with dims
  (dayofyear, hour, [level,] latitude, longitude) for ACC.

A *channel* is one (variable, level) pair, named ``geopotential_500`` or just ``2m_temperature``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import xarray as xr

from wxray.errors import DataError

TIME, LEVEL, LAT, LON = "time", "level", "latitude", "longitude"
TRAJECTORY = "trajectory"
STAT_NAMES = ("mean", "std", "diff_mean", "diff_std", "climatology")
CONSTANT_VARIABLES = ("land_sea_mask", "geopotential_at_surface", "soil_type",
                      "slope_of_sub_gridscale_orography")

# ERA5 short names (as cfgrib / ARCO / CDS netCDF write them) -> WeatherBench 2 long names.
SHORT_NAMES = {
    "z": "geopotential",
    "t": "temperature",
    "u": "u_component_of_wind",
    "v": "v_component_of_wind",
    "w": "vertical_velocity",
    "q": "specific_humidity",
    "r": "relative_humidity",
    "vo": "vorticity",
    "d": "divergence",
    "t2m": "2m_temperature",
    "2t": "2m_temperature",
    "u10": "10m_u_component_of_wind",
    "10u": "10m_u_component_of_wind",
    "v10": "10m_v_component_of_wind",
    "10v": "10m_v_component_of_wind",
    "msl": "mean_sea_level_pressure",
    "sp": "surface_pressure",
    "tp": "total_precipitation",
    "tcwv": "total_column_water_vapour",
    "sst": "sea_surface_temperature",
    "lsm": "land_sea_mask",
    "orography": "geopotential_at_surface",
}
# Coordinate aliases seen in ERA5 files.
COORD_ALIASES = {
    "lat": LAT, "lon": LON, "isobaricInhPa": LEVEL, "pressure_level": LEVEL, "plev": LEVEL,
    "valid_time": TIME,
}


@dataclass(frozen=True)
class Channel:
    variable: str
    level: int | None = None

    @property
    def name(self) -> str:
        return self.variable if self.level is None else f"{self.variable}_{self.level}"


def channels(ds: xr.Dataset, variables: list[str] | tuple[str, ...], levels: list[int] | tuple[int, ...] = (),
             source: str = "store") -> list[Channel]:
    """Expand variables x levels into channels, checking that each exists in `ds`."""
    out: list[Channel] = []
    for v in variables:
        if v not in ds.data_vars:
            raise DataError(f"{source}: variable '{v}' not found (has: {', '.join(map(str, ds.data_vars))})")
        if LEVEL in ds[v].dims:
            have = [int(x) for x in ds[LEVEL].values]
            wanted = list(levels) or have
            missing = [lv for lv in wanted if lv not in have]
            if missing:
                raise DataError(f"{source}: variable '{v}' has no level {missing} hPa (has: {have})")
            out.extend(Channel(v, int(lv)) for lv in wanted)
        else:
            out.append(Channel(v))
    return out


def select_channel(ds: xr.Dataset, ch: Channel) -> xr.DataArray:
    da = ds[ch.variable]
    return da.sel({LEVEL: ch.level}) if ch.level is not None else da


def time_step(ds: xr.Dataset) -> np.timedelta64:
    """The most common spacing of the time axis (the store's native step)."""
    t = ds[TIME].values
    if t.size < 2:
        raise DataError("store: need at least 2 time steps to define a time step")
    d = np.diff(t)
    vals, counts = np.unique(d, return_counts=True)
    return vals[np.argmax(counts)]


def open_store(path: str | Path) -> xr.Dataset:
    """Open a store (lazily) and check the conventions above."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"store {p} does not exist "
                        f"(make one with jobs/prepare_data.py or jobs/make_sample_data.py)")
    try:
        ds = xr.open_zarr(p, consolidated=False)
    except Exception as e:  # zarr raises many types for a foreign directory
        msg = f"store {p} is not a readable zarr store ({type(e).__name__}: {e})".splitlines()[0]
        raise DataError(msg) from None
    for dim in (TIME, LAT, LON):
        if dim not in ds.dims:
            raise DataError(f"store {p}: missing dimension '{dim}' (dims: {', '.join(map(str, ds.dims))})")
    lat = ds[LAT].values
    if lat.size > 1 and not np.all(np.diff(lat) > 0):
        raise DataError(f"store {p}: latitude must be strictly ascending (south to north)")
    t = ds[TIME].values
    if t.size > 1 and not np.all(np.diff(t) > np.timedelta64(0, "ns")):
        raise DataError(f"store {p}: time axis must be strictly increasing without duplicates")
    return ds


@dataclass
class Stats:
    mean: xr.Dataset
    std: xr.Dataset
    diff_mean: xr.Dataset
    diff_std: xr.Dataset
    climatology: xr.Dataset | None

    def channel(self, name: str, ch: Channel) -> float:
        """Scalar statistic `name` (mean/std/diff_mean/diff_std) of one channel."""
        da = getattr(self, name)[ch.variable]
        if ch.level is not None and LEVEL in da.dims:
            da = da.sel({LEVEL: ch.level})
        return float(da.values)


def open_stats(path: str | Path) -> Stats:
    p = Path(path)
    groups = {}
    for name in STAT_NAMES:
        try:
            groups[name] = xr.open_zarr(p, group=f"stats/{name}", consolidated=False)
        except Exception:
            if name == "climatology":
                groups[name] = None
                continue
            raise DataError(f"store {p}: missing stats group 'stats/{name}' "
                            f"(recompute with jobs/prepare_data.py)") from None
    return Stats(**groups)
