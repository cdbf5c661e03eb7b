"""Map raw parts onto the store conventions of `wxray.data.schema`, lazily (no data is read).

`normalize(ds, where)`:
* short ERA5 names -> WeatherBench 2 long names (`SHORT_NAMES`), coordinate aliases (`COORD_ALIASES`);
  a `z` with no pressure coordinate at all (ERA5 single-level/invariant files) is `geopotential_at_surface`;
* time: the valid time is used (cfgrib `valid_time` = `time` + `step`; a `step` dimension of forecast
  fields is folded into the time axis); a monthly climatology with an integer `month` dimension (such as
  `eraint_uvz.nc`) gets the time `MONTH_YEAR-MM-01T00` (placeholder year, recorded in the store attrs);
* auxiliary coordinates (step, valid_time, number when scalar, surface, heightAboveGround, expver, ...)
  are dropped and size-1 auxiliary dimensions squeezed; `trajectory` on time is kept;
* levels in hPa as int (Pa converted), ascending;
* latitude sorted ascending (south to north); longitude ascending and contiguous
  (`wxray.data.schema.canonical_longitudes`): a global grid (n * dlon = 360) in [0, 360); a regional box
  keeps its extent and its columns side by side — in [0, 360) when it fits there, in (-180, 180] when it
  crosses the prime meridian (10 W..2 E, given as -10..2 or as 350..359.75 + 0..2, becomes -10..2).

`select(parts, variables, levels, member)` keeps what was asked for (errors name the missing variable
or level and the file), `combine(parts)` merges parts sharing a time axis (variables split over files or
GRIB hypercubes) and orders the time segments (files) along time, checking the axis.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import xarray as xr

from wxray.data.schema import (
    CONSTANT_VARIABLES,
    COORD_ALIASES,
    LAT,
    LEVEL,
    LON,
    SHORT_NAMES,
    TIME,
    TRAJECTORY,
    canonical_longitudes,
)
from wxray.data.sources import Part
from wxray.errors import DataError

NUMBER = "number"  # a source's ensemble-member dim (ERA5 EDA, GRIB); forecasts use schema.MEMBER
MONTH_YEAR = 2000
STORE_DIMS = (TIME, NUMBER, LEVEL, LAT, LON)


@dataclass
class Segment:
    """Parts merged on one time axis (None for time-constant fields), ready to be written in order."""

    ds: xr.Dataset
    where: str
    reduce_members: bool = False  # ensemble mean taken over `number` when the block is loaded


PRESSURE_COORDS = ("isobaricInhPa", "pressure_level", "plev", LEVEL)


def _names(ds: xr.Dataset, where: str) -> xr.Dataset:
    ren: dict[str, str] = {}
    on_levels = any(c in ds.coords or c in ds.dims for c in PRESSURE_COORDS)
    for v in map(str, ds.data_vars):
        long = SHORT_NAMES.get(v)
        if v == "z" and not on_levels:  # ERA5 single-level / invariant `z` is the surface geopotential
            long = "geopotential_at_surface"
        if long and long != v:
            if long in ds.data_vars:
                raise DataError(f"{where}: holds both '{v}' and '{long}' (the same variable twice)")
            ren[v] = long
    for c in list(map(str, ds.coords)) + [str(d) for d in ds.dims if d not in ds.coords]:
        target = COORD_ALIASES.get(c)
        if target and target not in ds.coords and target not in ds.dims and target not in ren.values():
            ren[c] = target
    return ds.rename(ren) if ren else ds


def _time(ds: xr.Dataset, where: str) -> xr.Dataset:
    if "month" in ds.dims and TIME not in ds.dims:
        months = np.asarray(ds["month"].values) if "month" in ds.coords else np.array([])
        if months.size != ds.sizes["month"] or not np.all(np.isin(months, np.arange(1, 13))):
            raise DataError(f"{where}: dimension 'month' must hold month numbers 1..12")
        times = np.array([f"{MONTH_YEAR}-{int(m):02d}-01" for m in months], dtype="datetime64[ns]")
        ds = ds.rename({"month": TIME}).assign_coords({TIME: times})
        ds.attrs["wxray_time_note"] = f"monthly climatology: month M mapped to {MONTH_YEAR}-M-01T00"
    if "step" in ds.dims and ds.sizes["step"] == 1:
        ds = ds.isel(step=0)
    if "step" in ds.dims:
        if TIME not in ds.dims or "valid_time" not in ds.coords:
            raise DataError(f"{where}: forecast 'step' dimension without 'time'/'valid_time' coordinates")
        vt = ds["valid_time"].transpose(TIME, "step").values.reshape(-1)
        ds = ds.drop_vars("valid_time").stack(_valid=(TIME, "step"))
        ds = ds.drop_vars(["_valid", TIME, "step"]).assign_coords(_valid=vt).rename(_valid=TIME)
    if TIME not in ds.dims and TIME in ds.coords and ds[TIME].ndim == 0:
        ds = ds.expand_dims(TIME)
    if TIME in ds.dims and "valid_time" in ds.coords:
        vt = ds["valid_time"]
        if vt.dims == (TIME,) or (vt.ndim == 0 and ds.sizes[TIME] == 1):
            ds = ds.assign_coords({TIME: np.atleast_1d(vt.values)})
    if TIME in ds.dims:
        if TIME not in ds.coords or not np.issubdtype(ds[TIME].dtype, np.datetime64):
            raise DataError(f"{where}: time coordinate must hold dates (datetime64), "
                            f"got {ds[TIME].dtype if TIME in ds.coords else 'no values'}")
        ds = ds.assign_coords({TIME: ds[TIME].values.astype("datetime64[ns]")})
    return ds


def _aux(ds: xr.Dataset) -> xr.Dataset:
    if LEVEL in ds.coords and ds[LEVEL].ndim == 0:  # one pressure level, squeezed by the reader
        ds = ds.expand_dims(LEVEL)
    keep_traj = TRAJECTORY in ds.coords and ds[TRAJECTORY].dims == (TIME,)
    drop = [c for c in ds.coords if c not in ds.dims and not (c == TRAJECTORY and keep_traj)]
    ds = ds.drop_vars(drop)
    squeeze = {d: 0 for d in ds.dims if d not in STORE_DIMS and ds.sizes[d] == 1}
    return ds.isel(squeeze, drop=True) if squeeze else ds


def _levels(ds: xr.Dataset, where: str) -> xr.Dataset:
    if LEVEL not in ds.dims:
        return ds
    if LEVEL not in ds.coords:
        raise DataError(f"{where}: dimension '{LEVEL}' has no coordinate values")
    lev = np.asarray(ds[LEVEL].values, dtype=np.float64)
    if str(ds[LEVEL].attrs.get("units", "")).lower() in ("pa", "pascal", "pascals"):
        lev = lev / 100.0
    if not np.allclose(lev, np.round(lev)):
        raise DataError(f"{where}: pressure levels must be whole hPa, got {lev.tolist()}")
    if np.unique(lev).size != lev.size:
        raise DataError(f"{where}: duplicated pressure levels {lev.tolist()}")
    ds = ds.assign_coords({LEVEL: np.round(lev).astype(np.int64)})
    order = np.argsort(lev, kind="stable")  # levels ascending (hPa), as in WeatherBench 2 stores
    return ds if np.array_equal(order, np.arange(lev.size)) else ds.isel({LEVEL: order})


def _grid(ds: xr.Dataset, where: str) -> xr.Dataset:
    for c in (LAT, LON):
        if c not in ds.dims or c not in ds.coords or ds[c].ndim != 1:
            raise DataError(f"{where}: needs a 1-D '{c}' coordinate (regular lat/lon grid); "
                            f"dims are {', '.join(map(str, ds.dims))}")
    lat = np.asarray(ds[LAT].values, dtype=np.float64)
    if np.unique(lat).size != lat.size or np.any(np.abs(lat) > 90):
        raise DataError(f"{where}: latitudes must be distinct values in [-90, 90]")
    order = np.argsort(lat, kind="stable")
    if np.array_equal(order, np.arange(lat.size)[::-1]):
        ds = ds.isel({LAT: slice(None, None, -1)})
    elif not np.array_equal(order, np.arange(lat.size)):
        ds = ds.isel({LAT: order})
    lon, _, _ = canonical_longitudes(ds[LON].values, where)
    ds = ds.assign_coords({LAT: np.sort(lat), LON: lon})
    order = np.argsort(lon, kind="stable")
    if not np.array_equal(order, np.arange(lon.size)):
        ds = ds.isel({LON: order})
    return ds


def normalize(ds: xr.Dataset, where: str) -> xr.Dataset:
    """The store conventions applied to one raw part (see the module docstring)."""
    ds = _names(ds, where)
    ds = _time(ds, where)
    ds = _aux(ds)
    ds = _levels(ds, where)
    return _grid(ds, where)


def _member(ds: xr.Dataset, member: int | str | None, where: str) -> tuple[xr.Dataset, bool]:
    if NUMBER not in ds.dims:
        if member is not None:
            raise DataError(f"{where}: member={member} asked for but the source has no ensemble members "
                            f"(no '{NUMBER}' dimension)")
        return ds, False
    have = [int(x) for x in ds[NUMBER].values] if NUMBER in ds.coords else list(range(ds.sizes[NUMBER]))
    if member is None:
        if len(have) == 1:
            return ds.isel({NUMBER: 0}, drop=True), False
        raise DataError(f"{where}: has {len(have)} ensemble members {have}; "
                        f"set member=<number> or member=mean")
    if member == "mean":
        return ds, True
    if member not in have:
        raise DataError(f"{where}: has no ensemble member {member} (members: {have})")
    return ds.isel({NUMBER: have.index(int(member))}, drop=True), False


def select(parts: list[Part], variables: list[str] | tuple[str, ...] = (),
           levels: list[int] | tuple[int, ...] = (), member: int | str | None = None,
           source: str = "source") -> list[Segment]:
    """Normalize every part and keep the requested variables / levels / member."""
    parts = [Part(normalize(p.ds, p.where), p.where) for p in parts]
    have = sorted({str(v) for p in parts for v in p.ds.data_vars if {LAT, LON} <= set(p.ds[v].dims)})
    want = list(dict.fromkeys(SHORT_NAMES.get(v, v) for v in variables)) or have
    if not want:
        raise DataError(f"{source}: no gridded variable (with latitude and longitude) found")
    for v in want:
        if v not in have:
            raise DataError(f"{source}: variable '{v}' not found (has: {', '.join(have)})")
    if levels and not any(LEVEL in p.ds[v].dims for p in parts for v in p.ds.data_vars if v in want):
        raise DataError(f"{source}: levels={list(levels)} asked for but no requested variable "
                        f"has pressure levels")
    out: list[Segment] = []
    for p in parts:
        names = [v for v in p.ds.data_vars if v in want]
        if not names:
            continue
        ds = p.ds[names]
        for v in names:
            extra = [d for d in ds[v].dims if d not in STORE_DIMS]
            if extra:
                raise DataError(f"{p.where}: variable '{v}' has unsupported dimension(s) {extra} "
                                f"(expected time, [level,] latitude, longitude)")
            if levels and LEVEL in ds[v].dims:
                lv = [int(x) for x in ds[LEVEL].values]
                missing = [int(x) for x in levels if int(x) not in lv]
                if missing:
                    raise DataError(f"{p.where}: variable '{v}' has no level {missing} hPa (has: {lv})")
        if levels and LEVEL in ds.dims:
            ds = ds.sel({LEVEL: sorted({int(x) for x in levels})})
        ds, reduce = _member(ds, member, p.where)
        for v in names:
            if v in CONSTANT_VARIABLES and TIME in ds[v].dims:  # constants: the first time is the field
                ds[v] = ds[v].isel({TIME: 0}, drop=True)
        ds = ds.transpose(*[d for d in STORE_DIMS if d in ds.dims])
        out.append(Segment(ds, p.where, reduce))
    return out


def _merge(group: list[Segment]) -> Segment:
    if len(group) == 1:
        return group[0]
    seen: dict[str, str] = {}
    for s in group:
        for v in map(str, s.ds.data_vars):
            if v in seen:
                raise DataError(f"variable '{v}' appears twice for the same times "
                                f"(in {seen[v]} and {s.where})")
            seen[v] = s.where
    where = ", ".join(dict.fromkeys(s.where for s in group))
    try:
        ds = xr.merge([s.ds for s in group], join="exact", compat="override", combine_attrs="drop_conflicts")
    except ValueError as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DataError(f"{where}: parts do not share one grid / level axis ({why})") from None
    return Segment(ds, where, any(s.reduce_members for s in group))


def combine(segments: list[Segment], order: list[str] | tuple[str, ...] = ()) -> tuple[list[Segment],
                                                                                       xr.Dataset | None]:
    """Merge parts with the same time axis, order them along time; split off the constant fields.

    Variables come in the order of `order` (long or short names), then in source order.
    """
    constants: dict[str, xr.DataArray] = {}
    timed: list[Segment] = []
    for s in segments:
        const = [v for v in s.ds.data_vars if TIME not in s.ds[v].dims]
        for v in const:
            constants.setdefault(str(v), s.ds[v])
        rest = [v for v in s.ds.data_vars if v not in const]
        if rest:
            timed.append(Segment(s.ds[rest], s.where, s.reduce_members))
    groups: dict[bytes, list[Segment]] = {}
    for s in timed:
        groups.setdefault(s.ds[TIME].values.tobytes(), []).append(s)
    merged = sorted((_merge(g) for g in groups.values()), key=lambda s: s.ds[TIME].values[0])
    rank = {SHORT_NAMES.get(v, v): i for i, v in enumerate(order)}
    for s in merged:
        names = sorted(map(str, s.ds.data_vars), key=lambda v: rank.get(v, len(rank)))
        s.ds = s.ds[names]
    if merged:
        ref = merged[0]
        for s in merged[1:]:
            if set(s.ds.data_vars) != set(ref.ds.data_vars):
                raise DataError(f"{s.where}: holds variables {sorted(map(str, s.ds.data_vars))} but "
                                f"{ref.where} holds {sorted(map(str, ref.ds.data_vars))}")
            for c in (LAT, LON, LEVEL):
                if (c in s.ds.coords) != (c in ref.ds.coords) or (
                        c in s.ds.coords and not np.array_equal(s.ds[c].values, ref.ds[c].values)):
                    raise DataError(f"{s.where}: its '{c}' axis differs from that of {ref.where}")
        check_time_axis(merged)
    const_ds = xr.Dataset(constants) if constants else None
    if const_ds is not None and merged:
        for c in (LAT, LON):
            if not np.array_equal(const_ds[c].values, merged[0].ds[c].values):
                raise DataError(f"constant fields {sorted(constants)}: grid differs from "
                                f"the time-varying fields")
    return merged, const_ds


def check_time_axis(segments: list[Segment]) -> np.ndarray:
    """The full time axis; DataError naming the file if it is not strictly increasing."""
    times = np.concatenate([s.ds[TIME].values for s in segments])
    owner = np.concatenate([np.full(s.ds.sizes[TIME], i) for i, s in enumerate(segments)])
    bad = np.nonzero(np.diff(times) <= np.timedelta64(0, "ns"))[0]
    if bad.size:
        i = int(bad[0])
        a, b = segments[owner[i]].where, segments[owner[i + 1]].where
        where = a if a == b else f"{a} / {b}"
        t0, t1 = np.datetime_as_string(times[i], "s"), np.datetime_as_string(times[i + 1], "s")
        what = f"duplicated time {t0}" if times[i] == times[i + 1] else f"time {t0} is followed by {t1}"
        raise DataError(f"{where}: time axis must be strictly increasing without duplicates ({what})")
    return times
