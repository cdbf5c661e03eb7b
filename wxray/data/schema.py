"""The wxray store: WeatherBench 2 conventions, one place that defines them.

A store is a zarr v3 group holding an xarray Dataset:

* dims ``time``, optional ``level`` (hPa, int), ``latitude`` (degrees, **ascending: south to north**,
  as in the WeatherBench 2 zarr stores), ``longitude`` (degrees, strictly ascending and contiguous):
  - a *global* grid (the longitudes cover the full circle at one regular spacing, n * dlon = 360) lies in
    [0, 360), as in the WeatherBench 2 stores;
  - a *regional* grid (a box) keeps its columns side by side, never split by the wrap: in [0, 360) when
    the box fits there (20 E..40 E, 60 W..20 W as 300..340), in (-180, 180] when it crosses the prime
    meridian (10 W..2 E is -10..2, not 0..2 then 350..359.75); a box crossing both 0 and 180 E is refused;
  - the store attrs ``grid_kind`` ("global" | "regional") and ``longitude_convention`` ("0-360" |
    "-180-180") record which (`canonical_longitudes` decides; `open_store` checks it);
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

from wxray.data import location
from wxray.data.dims import INIT, LAT, LEAD, LEVEL, LON, MEMBER, TIME, TRAJECTORY  # noqa: F401 (named here by callers)
from wxray.errors import DataError

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


GLOBAL, REGIONAL = "global", "regional"
LON_360, LON_180 = "0-360", "-180-180"  # [0, 360) and (-180, 180]
_SPACING_RTOL = 1e-3  # of the grid spacing: float32 coordinates of a 0.25-degree grid pass


def wrap_longitudes(lon: np.ndarray, convention: str) -> np.ndarray:
    """Longitudes in [0, 360) (LON_360) or (-180, 180] (LON_180); values already there are kept bit for bit."""
    lon = np.asarray(lon, dtype=np.float64)
    if convention == LON_360:
        return np.where((lon >= 0) & (lon < 360), lon, np.mod(lon, 360.0))
    if convention == LON_180:
        return np.where((lon > -180) & (lon <= 180), lon, 180.0 - np.mod(180.0 - lon, 360.0))
    raise ValueError(f"unknown longitude convention {convention!r} (expected {LON_360!r} or {LON_180!r})")


def longitude_convention(lon: np.ndarray) -> str:
    """The convention an axis already in canonical form uses: LON_180 when any longitude is negative."""
    lon = np.asarray(lon, dtype=np.float64)
    return LON_180 if lon.size and float(lon.min()) < 0 else LON_360


def grid_kind(lon: np.ndarray) -> str:
    """GLOBAL when the longitudes cover the full circle at one regular spacing (n * dlon = 360), else REGIONAL."""
    s = np.unique(wrap_longitudes(lon, LON_360))
    if s.size < 2 or s.size != np.asarray(lon).size:
        return REGIONAL
    gaps = np.diff(np.append(s, s[0] + 360.0))
    step = 360.0 / s.size
    return GLOBAL if np.allclose(gaps, step, rtol=0, atol=_SPACING_RTOL * step) else REGIONAL


def canonical_longitudes(lon: np.ndarray, where: str, split_ok: bool = False) -> tuple[np.ndarray, str, str]:
    """(longitudes in the store convention, in the order given; grid kind; longitude convention).

    Global grids go to [0, 360); a regional box to [0, 360) unless it crosses 0 E, then to (-180, 180].
    The box is what the largest gap between neighbouring meridians leaves. Duplicated meridians (0 and
    360) and a box crossing both 0 and 180 E are DataErrors; with `split_ok` (verification, where only
    pointwise scores need the axis) such a box is left in [0, 360).
    """
    lon = np.asarray(lon, dtype=np.float64)
    w = wrap_longitudes(lon, LON_360)
    uniq, counts = np.unique(w, return_counts=True)
    if uniq.size != w.size:
        raise DataError(f"{where}: longitude {uniq[counts > 1][0]:g} E appears twice "
                        f"(the same meridian, e.g. 0 and 360, or -180 and 180)")
    kind = grid_kind(lon)
    if kind == GLOBAL or lon.size < 2:
        return w, kind, LON_360
    gaps = np.diff(np.append(uniq, uniq[0] + 360.0))
    if gaps[-1] >= gaps.max() - 1e-9:  # the widest gap is the one through 0 E: the box fits in [0, 360)
        return w, REGIONAL, LON_360
    k = int(np.argmax(gaps))
    west, east = uniq[k + 1], uniq[k]
    if west > 180 and east <= 180:
        return wrap_longitudes(lon, LON_180), REGIONAL, LON_180
    if split_ok:
        return w, REGIONAL, LON_360
    raise DataError(f"{where}: regional longitudes from {west:g} E eastwards to {east:g} E cross both 0 and "
                    f"180 E; a regional box must fit in [0, 360) or in (-180, 180]")


@dataclass(frozen=True)
class Channel:
    variable: str
    level: int | None = None

    @property
    def name(self) -> str:
        return self.variable if self.level is None else f"{self.variable}_{self.level}"


def channels(ds: xr.Dataset, variables: list[str] | tuple[str, ...], levels: list[int] | tuple[int, ...] = (),
             source: str = "store", check_levels: bool = True) -> list[Channel]:
    """Expand variables x levels into channels, checking that each exists in `ds`.

    `levels` asked for when no requested variable has a level dim is an error (as in prepare_data's
    `wxray.data.normalize.select`), not silently ignored; `check_levels=False` leaves that check to a
    caller that expands several variable lists with the same levels (training inputs and targets)."""
    out: list[Channel] = []
    for v in variables:
        if v not in ds.data_vars:
            raise DataError(f"{source}: variable '{v}' not found (has: {', '.join(map(str, ds.data_vars))})")
    if check_levels and levels and variables and not any(LEVEL in ds[v].dims for v in variables):
        on = [str(v) for v in ds.data_vars if LEVEL in ds[v].dims]
        off = [str(v) for v in ds.data_vars if LEVEL not in ds[v].dims]
        raise DataError(f"{source}: levels={list(levels)} asked for but no requested variable has pressure "
                        f"levels (with levels: {', '.join(on) or 'none'}; without: {', '.join(off) or 'none'})")
    for v in variables:
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
    """Open a store (lazily; a local path or a URL, `wxray.data.location`) and check the conventions above."""
    p = str(path)
    if not location.reachable(p, "store"):
        raise DataError(f"store {p} does not exist "
                        f"(make one with jobs/prepare_data.py or jobs/make_sample_data.py)")
    try:
        ds = location.open_zarr(p)
    except Exception as e:  # zarr raises many types for a foreign directory
        msg = f"store {p} is not a readable zarr store ({type(e).__name__}: {e})".splitlines()[0]
        raise DataError(msg) from None
    for dim in (TIME, LAT, LON):
        if dim not in ds.dims:
            raise DataError(f"store {p}: missing dimension '{dim}' (dims: {', '.join(map(str, ds.dims))})")
    lat = ds[LAT].values
    if lat.size > 1 and not np.all(np.diff(lat) > 0):
        raise DataError(f"store {p}: latitude must be strictly ascending (south to north)")
    _check_longitude(ds, p)
    t = ds[TIME].values
    if t.size > 1 and not np.all(np.diff(t) > np.timedelta64(0, "ns")):
        raise DataError(f"store {p}: time axis must be strictly increasing without duplicates")
    return ds


def _check_longitude(ds: xr.Dataset, p: str) -> None:
    lon = np.asarray(ds[LON].values, dtype=np.float64)
    if lon.size > 1 and not np.all(np.diff(lon) > 0):
        raise DataError(f"store {p}: longitude must be strictly ascending (west to east)")
    canon, kind, conv = canonical_longitudes(lon, f"store {p}")
    if not np.array_equal(canon, lon):
        raise DataError(f"store {p}: longitudes {lon[0]:g}..{lon[-1]:g} break the store convention "
                        f"([0, 360) for a global grid; a regional box contiguous, in (-180, 180] only when "
                        f"it crosses 0 E); reconvert it with jobs/prepare_data.py")
    for key, have in (("grid_kind", kind), ("longitude_convention", conv)):
        if key in ds.attrs and ds.attrs[key] != have:
            raise DataError(f"store {p}: attrs say {key}={ds.attrs[key]!r} but its longitudes "
                            f"{lon[0]:g}..{lon[-1]:g} make it {have!r}")


def grid_attrs(lon: np.ndarray) -> dict[str, str]:
    """The store attrs recording the grid kind and longitude convention of a canonical axis."""
    _, kind, conv = canonical_longitudes(lon, "grid")
    return {"grid_kind": kind, "longitude_convention": conv}


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


def open_climatology(path: str | Path) -> xr.Dataset | None:
    """A store's `stats/climatology` (lazily), None when it has none: ACC is then not applicable."""
    try:
        return location.open_zarr(path, group="stats/climatology")
    except Exception:  # the zarr backends raise many types for a missing group or a file
        return None


def open_stats(path: str | Path) -> Stats:
    p = str(path)
    groups = {}
    for name in STAT_NAMES[:-1]:
        try:
            groups[name] = location.open_zarr(p, group=f"stats/{name}")
        except Exception:
            raise DataError(f"store {p}: missing stats group 'stats/{name}' "
                            f"(recompute with jobs/prepare_data.py)") from None
    return Stats(**groups, climatology=open_climatology(p))
