"""Forecast and truth datasets for verification: opening, conventions, alignment, persistence.

Forecast convention: dims `init_time`, `lead_time` (timedelta), optional member dims (`member`, or
`encoder_draw` x `dropout_draw`), optional `level`, `latitude`, `longitude`.
The truth is a store (wxray.data.schema) or any ERA5 file (netCDF, GRIB) with a `time` dim, looked up
at valid time init + lead.

Grids are oriented on read, lazily (index selections, nothing loaded), so truth, forecast, baseline and
the truth's `stats/climatology` may come in either latitude order and either longitude convention:
latitude ascending; longitude ascending in the store convention (`wxray.data.schema.canonical_longitudes`:
[0, 360) for a global grid, a regional box contiguous, in (-180, 180] when it crosses 0 E). The forecast
and baseline are then put in the truth's longitude convention (`check_grid`), so a forecast in [0, 360)
and a truth in [-180, 180) on the same points match. A forecast on a block of the truth's points (a grid
cropped to fit a model, `wxray.data.gridfit`, or a regional box across 0 E, -45..45, of a global
[0, 360) truth) is scored on those truth points, without interpolation; a genuinely different grid is an
error, or is interpolated with regrid=true (periodically in longitude only for a global source grid; a
regional source covers only its arc, `longitude_arc`). Errors give longitudes on the canonical axis.
"""

from __future__ import annotations

# Bind Python's sqlite3 to the system SQLite before cfgrib loads ecCodes, whose eckitlib wheel exports an
# old bundled SQLite (3.26) globally; MLflow's sqlite tracking store would then refuse to start.
import sqlite3  # noqa: F401  isort: skip
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

from wxray.data import location
from wxray.data.schema import (
    COORD_ALIASES,
    GLOBAL,
    INIT,
    LAT,
    LEAD,
    LEVEL,
    LON,
    LON_360,
    MEMBER,
    SHORT_NAMES,
    TIME,
    canonical_longitudes,
    grid_kind,
    longitude_convention,
    open_climatology,
    wrap_longitudes,
)
from wxray.data.sources import detect_kind, first_line, open_grib, open_netcdf
from wxray.errors import DataError
from wxray.verify.ensemble import MEMBER_DIMS

# ERA5 ensemble files number their members; cfgrib calls the forecast step `step`.
EXTRA_ALIASES = {"number": MEMBER, "ensemble_member": MEMBER, "realization": MEMBER, "step": LEAD}


def open_any(path: str | Path, what: str) -> xr.Dataset:
    """Open a zarr directory, or a GRIB/netCDF file through the data pipeline's reader
    (`wxray.data.sources`: a GRIB file is scanned message by message first, so a corrupt or truncated
    one is the same one-line DataError as in prepare_data, prefixed with `what`). A URL is a zarr store
    (`wxray.data.location`)."""
    if location.is_remote(path):
        return _open_remote(str(path), what)
    p = Path(path)
    if not p.exists():
        raise DataError(f"{what} {p} does not exist")
    if p.is_dir():
        try:
            return xr.open_zarr(p, consolidated=False)
        except Exception as e:  # the backend raises many types for a foreign or damaged store
            raise DataError(f"{what} {p} cannot be read ({first_line(e)})") from None
    try:
        kind = detect_kind(str(p))
        if kind == "grib":
            return _combine(open_grib(str(p), decode_timedelta=True), p)
        if kind == "netcdf":
            return open_netcdf(str(p), decode_timedelta=True)
    except DataError as e:  # "source <p>: ..." or "<p>: ..." -> "<what> <p>: ..."
        raise DataError(f"{what} {str(e).removeprefix('source ')}") from None
    raise DataError(f"{what} {p}: unknown format (expected a zarr directory, netCDF or GRIB file)")


def _open_remote(url: str, what: str) -> xr.Dataset:
    if not location.reachable(url, what):
        raise DataError(f"{what} {url} does not exist")
    try:
        return location.open_zarr(url)
    except Exception as e:  # not a zarr store
        raise DataError(f"{what} {url} cannot be read ({first_line(e)})") from None


def _combine(parts: list[xr.Dataset], p: Path) -> xr.Dataset:
    """A GRIB file's hypercubes (e.g. pressure-level and surface fields) as one dataset."""
    if len(parts) == 1:
        return parts[0]
    try:
        return xr.merge(parts, compat="override", join="outer", combine_attrs="drop_conflicts")
    except Exception as e:
        raise DataError(f"{p}: its {len(parts)} GRIB hypercubes cannot be combined ({first_line(e)})") from None


def _reorder(ds: xr.Dataset, dim: str, values: np.ndarray, what: str) -> xr.Dataset:
    """`dim` given `values` (same order as now), then sorted ascending by an index selection (lazy)."""
    uniq, counts = np.unique(values, return_counts=True)
    if uniq.size != values.size:
        raise DataError(f"{what}: {dim} {uniq[counts > 1][0]:g} appears twice (expected distinct values)")
    ds = ds.assign_coords({dim: values})
    steps = np.diff(values)
    if np.all(steps > 0):
        return ds
    if np.all(steps < 0):
        return ds.isel({dim: slice(None, None, -1)})
    return ds.isel({dim: np.argsort(values, kind="stable")})


def orient(ds: xr.Dataset, what: str = "dataset", convention: str | None = None) -> xr.Dataset:
    """Latitude ascending; longitude ascending in `convention` ("0-360" | "-180-180"), or by default in the
    store convention of its own grid (see the module docstring). Lazy: only coordinates are read."""
    if LAT in ds.coords and ds[LAT].ndim == 1 and LAT in ds.dims:
        ds = _reorder(ds, LAT, np.asarray(ds[LAT].values, dtype=np.float64), what)
    if LON in ds.coords and ds[LON].ndim == 1 and LON in ds.dims:
        lon = ds[LON].values
        if convention is None:
            values = canonical_longitudes(lon, what, split_ok=True)[0]
        else:
            values = wrap_longitudes(lon, convention)
        ds = _reorder(ds, LON, values, what)
    return ds


def normalise(ds: xr.Dataset, time_dim: str = TIME, what: str = "dataset",
              convention: str | None = None) -> xr.Dataset:
    """Long variable names, standard coord names, int levels and the grid orientation of `orient`."""
    aliases = {**COORD_ALIASES, **EXTRA_ALIASES}
    if time_dim != TIME:
        aliases["time"] = time_dim
    if "valid_time" in ds.coords and (TIME in ds.dims or time_dim in ds.dims or "time" in ds.dims):
        ds = ds.drop_vars("valid_time")  # cfgrib's derived coordinate; the dim is the reference
    ds = ds.rename({k: v for k, v in aliases.items() if k in ds.variables and v not in ds.variables})
    ds = ds.rename_vars({k: v for k, v in SHORT_NAMES.items() if k in ds.data_vars and v not in ds.variables})
    ds = orient(ds, what, convention)
    if LEVEL in ds.coords and ds[LEVEL].ndim == 1:
        ds = ds.assign_coords({LEVEL: ds[LEVEL].values.astype(np.int64)})
    scalar = [c for c in ds.coords if c not in ds.dims and ds[c].ndim == 0 and c != LEAD]
    return ds.drop_vars(scalar)


def to_forecast_convention(ds: xr.Dataset, source: str, what: str = "forecast") -> xr.Dataset:
    """`what` (forecast or baseline) names the input in errors."""
    ds = normalise(ds, time_dim=INIT, what=f"{what} {source}")
    if INIT not in ds.dims:
        raise DataError(f"{what} {source}: no '{INIT}' dimension (dims: {', '.join(map(str, ds.dims))})")
    if LEAD not in ds.dims:
        if LEAD in ds.coords and ds[LEAD].ndim == 0:  # an analysis or single-step file
            ds = ds.expand_dims(LEAD)
        else:
            dims = ", ".join(map(str, ds.dims))
            raise DataError(f"{what} {source}: no '{LEAD}' dimension (dims: {dims})")
    if not np.issubdtype(ds[LEAD].dtype, np.timedelta64):
        raise DataError(f"{what} {source}: '{LEAD}' must be a timedelta, got {ds[LEAD].dtype}")
    known = {INIT, LEAD, LEVEL, LAT, LON, *MEMBER_DIMS}
    for name, var in ds.data_vars.items():
        extra = [d for d in var.dims if d not in known]
        if extra:
            raise DataError(f"{what} {source}: variable '{name}' has unknown dim(s) {extra} "
                            f"(member dims must be named one of {', '.join(MEMBER_DIMS)})")
    for dim in (LAT, LON):
        if dim not in ds.dims:
            raise DataError(f"{what} {source}: missing dimension '{dim}'")
    ds = ds.drop_vars([c for c in ds.coords if c not in ds.dims])
    return ds.transpose(*[d for d in (INIT, LEAD, *MEMBER_DIMS) if d in ds.dims], ..., LAT, LON)


def open_forecast(path: str | Path, what: str = "forecast") -> xr.Dataset:
    return to_forecast_convention(open_any(path, what), str(path), what)


def open_truth(path: str | Path, member: str = "") -> tuple[xr.Dataset, xr.Dataset | None]:
    """The truth dataset (oriented, see the module docstring) and its climatology (None when it has none).

    A store directory need not follow the store conventions (an ARCO-ERA5 subset runs north to south);
    its `stats/climatology` group, used for ACC, is oriented like the truth. A truth file with ensemble
    members (e.g. ERA5 EDA) needs `member`: "mean" for the ensemble mean, or an integer for one member
    (the held-out member when it is also the forecast).
    """
    p = str(path)
    ds = normalise(open_any(p, "truth"), what=f"truth {p}")
    for dim in (TIME, LAT, LON):
        if dim not in ds.dims:
            raise DataError(f"truth {p}: no '{dim}' dimension (dims: {', '.join(map(str, ds.dims))})")
    times = pd.DatetimeIndex(ds[TIME].values)
    if times.has_duplicates:
        raise DataError(f"truth {p}: duplicated time {times[times.duplicated()][0]} (expected distinct times)")
    if not times.is_monotonic_increasing:
        ds = ds.sortby(TIME)
    climatology = open_climatology(p) if location.is_remote(p) or Path(p).is_dir() else None
    if climatology is not None:
        climatology = normalise(climatology, what=f"truth {p} stats/climatology",
                                convention=longitude_convention(ds[LON].values))
    members = [d for d in MEMBER_DIMS if d in ds.dims]
    if members:
        ds = select_truth_member(ds, members, member, str(p))
    elif member:
        raise DataError(f"truth {p} has no member dim but truth_member={member!r} was given")
    return ds.drop_vars([c for c in ds.coords if c not in ds.dims]), climatology


def select_truth_member(ds: xr.Dataset, dims: Sequence[str], member: str, source: str) -> xr.Dataset:
    if not member:
        raise DataError(f"truth {source} has member dim(s) {list(dims)}: set truth_member=mean or an index")
    if member == "mean":  # in float64, like the forecast's ensemble mean it will be compared with
        return ds.astype(np.float64).mean(list(dims), keep_attrs=True)
    if len(dims) != 1 or not member.lstrip("-").isdigit():
        raise DataError(f"truth {source}: truth_member must be 'mean' or a member index, got {member!r}")
    k = ds.sizes[dims[0]]
    idx = int(member)
    if not 0 <= idx < k:
        raise DataError(f"truth {source}: truth_member {idx} out of range (has {k} members)")
    return ds.isel({dims[0]: idx})


def drop_member(forecast: xr.Dataset, member: str) -> xr.Dataset:
    """The forecast without the held-out truth member (when forecast and truth are the same file)."""
    if not member.isdigit() or MEMBER not in forecast.dims:
        return forecast
    keep = [i for i in range(forecast.sizes[MEMBER]) if i != int(member)]
    return forecast.isel({MEMBER: keep})


def same_grid(a: xr.Dataset | xr.DataArray, b: xr.Dataset | xr.DataArray) -> bool:
    return all(a.sizes[d] == b.sizes[d] and np.allclose(a[d].values, b[d].values, atol=1e-6)
               for d in (LAT, LON))


def longitude_arc(lon: np.ndarray, where: str = "grid") -> tuple[float, float]:
    """(west, east): the ends of a longitude axis in its canonical convention (`canonical_longitudes`).

    A regional axis spans the arc eastwards from `west` to `east` that the widest gap between neighbouring
    meridians leaves (ties go to the gap through 0 E, as in `canonical_longitudes`), e.g. (-45, 45) for
    315..359 and 0..45 E; a global axis gives its first and last meridian in [0, 360).
    """
    values, _, convention = canonical_longitudes(lon, where, split_ok=True)
    u = np.unique(wrap_longitudes(values, LON_360))
    gaps = np.diff(np.append(u, u[0] + 360.0))
    k = u.size - 1 if gaps[-1] >= gaps.max() - 1e-9 else int(np.argmax(gaps))
    west, east = wrap_longitudes(np.array([u[(k + 1) % u.size], u[k]]), convention)
    return float(west), float(east)


def regrid_like(forecast: xr.Dataset, target: xr.Dataset | xr.DataArray, source: str = "forecast") -> xr.Dataset:
    """Bilinear interpolation onto the target grid (both oriented, in any longitude conventions).

    A global source grid is periodic in longitude (no gap at the seam) and target rows poleward of its
    outermost latitudes take the value of that outermost row. A regional source grid is its arc
    (`longitude_arc`: positions west + ((lon - west) mod 360), so a box across 0 E is one interval in
    either convention) and its latitude range, not extended: every target point must lie inside it
    (DataError naming `source` otherwise; nothing across the gap outside the arc is filled).
    """
    lon, lat = forecast[LON].values, forecast[LAT].values
    t_lat, t_lon = np.asarray(target[LAT].values), np.asarray(target[LON].values)
    if grid_kind(lon) != GLOBAL:
        tol = 1e-6
        west, east = longitude_arc(lon, source)
        width = float(np.mod(east - west, 360.0))

        def offset(x: np.ndarray) -> np.ndarray:  # degrees east of `west`, in [-tol, 360 - tol)
            return np.mod(np.asarray(x, dtype=np.float64) - west + tol, 360.0) - tol

        t_off = offset(t_lon)
        if t_lat.min() < lat[0] - tol or t_lat.max() > lat[-1] + tol or t_off.max() > width + tol:
            raise DataError(f"{source}: regional grid ({_extent(forecast)}) does not cover the truth grid "
                            f"({_extent(target)}); regrid=true does not extend a regional grid")
        s_off = offset(lon)
        order = np.argsort(s_off, kind="stable")
        unwrapped = forecast.isel({LON: order}).assign_coords({LON: west + s_off[order]})
        at = {LAT: np.clip(t_lat, lat[0], lat[-1]), LON: west + np.clip(t_off, s_off.min(), s_off.max())}
        return unwrapped.interp(at, method="linear").assign_coords({LAT: t_lat, LON: t_lon})
    lon = wrap_longitudes(lon, LON_360)
    forecast = forecast.assign_coords({LON: lon}).isel({LON: np.argsort(lon, kind="stable")})
    lon = forecast[LON].values
    padded = xr.concat([forecast.isel({LON: [-1]}).assign_coords({LON: [lon[-1] - 360.0]}), forecast,
                        forecast.isel({LON: [0]}).assign_coords({LON: [lon[0] + 360.0]})], dim=LON)
    edges = []
    if lat[0] > -90:
        edges.append(padded.isel({LAT: [0]}).assign_coords({LAT: [-90.0]}))
    edges.append(padded)
    if lat[-1] < 90:
        edges.append(padded.isel({LAT: [-1]}).assign_coords({LAT: [90.0]}))
    padded = xr.concat(edges, dim=LAT) if len(edges) > 1 else padded
    at = {LAT: t_lat, LON: wrap_longitudes(t_lon, LON_360)}
    return padded.interp(at, method="linear").assign_coords({LON: t_lon})


def _extent(ds: xr.Dataset | xr.DataArray) -> str:
    """"latitude S..N, longitude W..E", the longitudes from the canonical axis (`longitude_arc`)."""
    lat = ds[LAT].values
    west, east = longitude_arc(ds[LON].values)
    return f"latitude {lat.min():g}..{lat.max():g}, longitude {west:g}..{east:g}"


def _positions(sub: np.ndarray, full: np.ndarray, tol: float = 1e-6) -> np.ndarray | None:
    """Indices of the ascending axis `sub` in the ascending axis `full` when `sub` is a contiguous run of
    `full`'s values (to `tol`); None otherwise (a coarser grid on every other point is not a crop)."""
    sub, full = np.asarray(sub, dtype=np.float64), np.asarray(full, dtype=np.float64)
    if sub.size == 0 or sub.size > full.size:
        return None
    i = np.searchsorted(full, sub)
    lo, hi = np.clip(i - 1, 0, full.size - 1), np.clip(i, 0, full.size - 1)
    j = np.where(np.abs(full[lo] - sub) <= np.abs(full[hi] - sub), lo, hi)
    if not np.all(np.abs(full[j] - sub) <= tol) or np.any(np.diff(j) != 1):
        return None
    return j


def subgrid(small: xr.Dataset | xr.DataArray, large: xr.Dataset | xr.DataArray) -> dict | None:
    """{latitude: rows, longitude: columns} of `large` that are exactly the points of `small` (both oriented
    in one longitude convention), or None when `small`'s grid is not a block cut out of `large`'s."""
    idx = {d: _positions(small[d].values, large[d].values) for d in (LAT, LON)}
    return None if any(v is None for v in idx.values()) else idx


def crop_to(ds: xr.Dataset, grid: xr.Dataset | xr.DataArray, what: str) -> xr.Dataset:
    """`ds` on the points of `grid`, a block of its grid (index selection, lazy), with `grid`'s coordinates.

    `ds` is first oriented in `grid`'s longitude convention, so a box across 0 E in (-180, 180] is a block
    of a global [0, 360) grid (its 315..359 and 0..45 E columns)."""
    ds = orient(ds, what, longitude_convention(grid[LON].values))
    idx = subgrid(grid, ds)
    if idx is None:
        raise DataError(f"{what}: grid {ds.sizes[LAT]}x{ds.sizes[LON]} does not contain the points of the "
                        f"{grid.sizes[LAT]}x{grid.sizes[LON]} grid to score ({_extent(grid)})")
    return ds.isel(idx).assign_coords({LAT: grid[LAT].values, LON: grid[LON].values})


def check_grid(forecast: xr.Dataset, truth: xr.Dataset, source: str, regrid: bool) -> xr.Dataset:
    """The forecast on the truth's points: oriented in the truth's longitude convention, then

    * the same grid: the truth's coordinates taken over;
    * a block of the truth grid (contiguous rows and columns, e.g. a model grid cropped to fit its
      patches, wxray.data.gridfit): kept with the truth's coordinate values; the caller scores it on
      those truth points (`crop_to`). A regional forecast is a block either in the truth's convention or
      in its own canonical one (a box across 0 E, -45..45, of a global [0, 360) truth: then it is
      returned in (-180, 180], and `crop_to` cuts the truth, its climatology and a baseline to it);
    * the truth grid a block of the forecast's (e.g. a baseline on the full grid when the truth was cropped
      to the forecast's): the truth's points selected, no interpolation;
    * otherwise interpolated with `regrid`, or a DataError.
    """
    forecast = orient(forecast, source, longitude_convention(truth[LON].values))
    if same_grid(forecast, truth):
        return forecast.assign_coords({LAT: truth[LAT].values, LON: truth[LON].values})
    inside = subgrid(forecast, truth)
    if inside is not None:
        return forecast.assign_coords({LAT: truth[LAT].values[inside[LAT]], LON: truth[LON].values[inside[LON]]})
    if grid_kind(forecast[LON].values) != GLOBAL:  # a block of the truth in the forecast's own convention?
        own = orient(forecast, source)
        t_lon = np.sort(wrap_longitudes(truth[LON].values, longitude_convention(own[LON].values)))
        rows, cols = _positions(own[LAT].values, truth[LAT].values), _positions(own[LON].values, t_lon)
        if rows is not None and cols is not None:
            return own.assign_coords({LAT: truth[LAT].values[rows], LON: t_lon[cols]})
    if subgrid(truth, forecast) is not None:
        return crop_to(forecast, truth, source)
    if not regrid:
        raise DataError(
            f"{source}: grid {forecast.sizes[LAT]}x{forecast.sizes[LON]} differs from the truth grid "
            f"{truth.sizes[LAT]}x{truth.sizes[LON]} (set regrid=true to interpolate onto the truth grid): "
            f"{_extent(forecast)} vs the truth's {_extent(truth)}")
    return regrid_like(forecast, truth, source)


def truth_at(truth: xr.DataArray, init_times: np.ndarray, lead: np.timedelta64, what: str) -> xr.DataArray:
    """Truth at valid time init + lead, with dim `init_time`; every valid time must exist."""
    valid = pd.DatetimeIndex(np.asarray(init_times) + lead)
    have = pd.DatetimeIndex(truth[TIME].values)
    missing = valid.difference(have)
    if len(missing):
        hours = lead / np.timedelta64(1, "h")
        raise DataError(f"{what}: no truth at lead {hours:g} h for {len(missing)} of {len(valid)} "
                        f"initialisations (first valid time missing: {missing[0]}; truth covers "
                        f"{have.min()} to {have.max()})")
    out = truth.sel({TIME: valid.values})
    return out.rename({TIME: INIT}).assign_coords({INIT: np.asarray(init_times)})


def persistence_forecast(store_ds: xr.Dataset, init_times: Sequence | np.ndarray,
                         leads: Sequence | np.ndarray, variables: Sequence[str] | None = None) -> xr.Dataset:
    """Persistence: the state at init_time, unchanged, for every lead (forecast convention).

    `leads` are timedeltas (or hours as numbers). Only variables with a time dim are kept.
    """
    inits = pd.DatetimeIndex(np.asarray(init_times, dtype="datetime64[ns]"))
    # np.timedelta64 subclasses np.integer, so test for timedeltas first.
    lead_td = np.array([x if isinstance(x, (np.timedelta64, pd.Timedelta)) else np.timedelta64(int(x), "h")
                        for x in leads], dtype="timedelta64[ns]")
    names = list(variables) if variables else [v for v in store_ds.data_vars if TIME in store_ds[v].dims]
    missing = inits.difference(pd.DatetimeIndex(store_ds[TIME].values))
    if len(missing):
        raise DataError(f"persistence: init time {missing[0]} not in the store ({len(missing)} missing)")
    state = store_ds[names].sel({TIME: inits.values}).rename({TIME: INIT})
    state = state.drop_vars([c for c in state.coords if c not in state.dims])
    out = state.expand_dims({LEAD: lead_td}, axis=1)
    return out.transpose(INIT, LEAD, ...).assign_attrs(source="persistence")
