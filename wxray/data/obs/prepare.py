"""A user's station table (CSV or Parquet) -> a point stream of an obs dir (`jobs/prepare_obs.py`).

    prepare_obs("synop.csv", "data/my_obs", stream="synop", variables=["t2m", "msl"], step_hours=6)

Columns are found by name, case-insensitively, under these aliases:

    station id   id | station | station_id | platform       (required; text or integers)
    time         time | date | datetime | valid_time        (required; ISO 8601 or what pandas parses;
                                                             time zones converted to naive UTC)
    latitude     lat | latitude                              (required; [-90, 90])
    longitude    lon | longitude | long                      (required; [-180, 360], stored in [0, 360))
    altitude     elevation | altitude | elev                 (optional, m; empty = unknown)
    quality      quality | qc | flag                         (optional: 0 good, 1 suspect, 2 bad; absent = 0)
    level        level                                       (optional, hPa: profiles, one row per level)

The variables are `variables` (column names, or the long names of ERA5 short-name columns) or else every
other numeric column (an `obs_id` column and pandas' `Unnamed: n` index columns excepted); ERA5 short names
become long names (`wxray.data.schema.SHORT_NAMES`: t2m -> 2m_temperature). Values may be empty (NaN =
not reported).

Every check runs before anything is written; a failure is a one-line DataError naming the file and column
(nothing written): a missing column, times that do not parse, coordinates out of range, a duplicated
(id, time[, level]) naming its first two rows, a time outside 1678..2261, a text cell in a variable column,
a value that is infinite or outside the variable's physical bounds (`wxray.data.obs.bounds`, overridable
with `bounds`), a stream of that name already in the obs dir (unless `overwrite`). The stream's statistics
(mean, std over quality-0 values) and `max_per_step` (most reports in any interval of one `step_hours`) come
from the data; obs.yaml is created or extended.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from wxray.data.obs.bounds import check_values
from wxray.data.obs.kinds.point import POINT, POINTS_PATH
from wxray.data.obs.points import (
    ALTITUDE,
    LAT,
    LEVEL,
    LON,
    OBS_ID,
    QUALITY,
    STATION,
    TIME,
    max_per_step,
    point_stats,
    report_times,
    to_table,
    write_point_stream,
)
from wxray.data.obs.registry import (
    REGISTRY,
    REGISTRY_LOCK,
    StreamInfo,
    check_name,
    empty_registry,
    open_registry,
    write_registry,
)
from wxray.data.schema import SHORT_NAMES
from wxray.data.sources import first_line
from wxray.errors import ConfigError, DataError
from wxray.io import lock

ALIASES = {
    STATION: ("id", "station", "station_id", "platform"),
    TIME: ("time", "date", "datetime", "valid_time"),
    LAT: ("lat", "latitude"),
    LON: ("lon", "longitude", "long"),
    ALTITUDE: ("elevation", "altitude", "elev"),
    QUALITY: ("quality", "qc", "flag"),
    LEVEL: ("level",),
}
REQUIRED = (STATION, TIME, LAT, LON)


@dataclass
class PrepareObsResult:
    obs_dir: Path
    stream: StreamInfo
    n_obs: int
    n_stations: int
    time_start: str
    time_end: str

    def figures(self) -> dict[str, Any]:
        s = self.stream
        return {"obs_dir": str(self.obs_dir), "stream": s.name, "kind": s.kind, "variables": s.variables,
                "levels": s.levels, "n_obs": self.n_obs, "n_stations": self.n_stations,
                "max_per_step": s.max_per_step, "time_start": self.time_start, "time_end": self.time_end,
                "mean": s.mean, "std": s.std}


def read_table(source: Path) -> pd.DataFrame:
    suffixes = [x.lower() for x in source.suffixes]
    if source.is_dir():
        raise DataError(f"source {source} is a directory; expected a .csv or .parquet file")
    if not source.is_file():
        raise DataError(f"source {source} does not exist")
    try:
        if suffixes[-1:] in ([".parquet"], [".pq"]):
            return pd.read_parquet(source)
        if ".csv" in suffixes[-2:] or ".txt" in suffixes[-1:]:
            return pd.read_csv(source, skipinitialspace=True)
    except Exception as e:  # parsers raise many types for a foreign file
        raise DataError(f"source {source} is not a readable table ({first_line(e)})") from None
    raise DataError(f"source {source}: expected a .csv or .parquet file")


def _columns(df: pd.DataFrame, where: str) -> dict[str, str]:
    """Role -> the source column holding it."""
    by_lower: dict[str, list[str]] = {}
    for c in df.columns:
        by_lower.setdefault(str(c).strip().lower(), []).append(c)
    found = {}
    for role, names in ALIASES.items():
        hits = [c for n in names for c in by_lower.get(n, [])]
        if len(hits) > 1:
            raise DataError(f"{where}: columns {', '.join(map(repr, hits))} both name the {role} (keep one)")
        if hits:
            found[role] = hits[0]
        elif role in REQUIRED:
            raise DataError(f"{where}: no {role} column (expected one of {', '.join(names)}; "
                            f"has: {', '.join(map(str, df.columns))})")
    return found


def long_name(name: str) -> str:
    return SHORT_NAMES.get(name.strip().lower(), name.strip())


def _variables(df: pd.DataFrame, roles: dict[str, str], wanted: list[str] | tuple[str, ...],
               where: str) -> dict[str, str]:
    """Variable (long name) -> source column."""
    taken = set(roles.values())
    candidates = [c for c in df.columns if c not in taken and str(c).lower() != OBS_ID
                  and not str(c).startswith("Unnamed:")]
    pairs: list[tuple[str, str]] = []
    if wanted:
        for w in wanted:
            hits = [c for c in candidates if str(c) == w or long_name(str(c)) == long_name(w)]
            if not hits:
                raise DataError(f"{where}: no column for variable '{w}' (columns: {', '.join(map(str, candidates))})")
            pairs.append((long_name(w), hits[0]))
    else:
        pairs = [(long_name(str(c)), c) for c in candidates if _numeric_enough(df[c])]
        if not pairs:
            raise DataError(f"{where}: no numeric variable columns besides {', '.join(map(str, taken))}")
    longs = [v for v, _ in pairs]
    dup = next((i for i, v in enumerate(longs) if longs.index(v) != i), None)
    if dup is not None:
        first = pairs[longs.index(longs[dup])][1]
        raise DataError(f"{where}: columns '{first}' and '{pairs[dup][1]}' both give variable '{longs[dup]}'"
                        if first != pairs[dup][1] else f"{where}: variable '{longs[dup]}' is asked for twice")
    out = dict(pairs)
    for v, c in out.items():
        if v in (OBS_ID, TIME, STATION, LAT, LON, LEVEL, ALTITUDE, QUALITY):
            raise DataError(f"{where}: column '{c}' would become variable '{v}', a reserved column name")
        if not _numeric_enough(df[c]):
            raise DataError(f"{where}: column '{c}' (variable '{v}') is not numeric")
    return out


def _numeric_enough(col: pd.Series) -> bool:
    """A numeric column, or one whose filled cells are mostly numbers (a stray text cell is then an error
    naming it, rather than the whole variable vanishing)."""
    if pd.api.types.is_bool_dtype(col):
        return False
    if pd.api.types.is_numeric_dtype(col):
        return True
    filled = col.dropna()
    filled = filled[filled.astype(str).str.strip() != ""]
    return len(filled) > 0 and pd.to_numeric(filled, errors="coerce").notna().mean() >= 0.5


def _values(col: pd.Series, variable: str, where: str, bounds: dict[str, tuple[float, float]] | None) -> np.ndarray:
    """The column as float32; a text cell, an infinite value or one outside the bounds is a DataError."""
    x = pd.to_numeric(col, errors="coerce").to_numpy(dtype=np.float64)
    text = np.flatnonzero(np.isnan(x) & col.notna().to_numpy() & (col.astype(str).str.strip() != "").to_numpy())
    if text.size:
        i = int(text[0])
        raise DataError(f"{where}: column '{col.name}' (variable '{variable}'): {col.iloc[i]!r} ({_row(i)}) "
                        f"is not a number")
    check_values(x, variable, str(col.name), where, bounds)
    return x.astype(np.float32)


def _row(i: int) -> str:
    return f"data row {i + 1}"


def _times(col: pd.Series, name: str, where: str) -> np.ndarray:
    if pd.api.types.is_numeric_dtype(col) and not pd.api.types.is_datetime64_any_dtype(col):
        raise DataError(f"{where}: column '{name}' holds numbers, not times (expected ISO 8601 like "
                        f"2020-01-01T06:00)")
    t = pd.to_datetime(col, utc=True, errors="coerce", format="ISO8601")
    if t.isna().any():  # not all ISO 8601: let pandas infer the format (quietly: a failure is our error line)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t = pd.to_datetime(col, utc=True, errors="coerce")
    bad = np.flatnonzero(t.isna().to_numpy())
    if bad.size:
        raise DataError(f"{where}: column '{name}': time {col.iloc[bad[0]]!r} ({_row(bad[0])}) is not parseable")
    naive = t.dt.tz_localize(None).to_numpy()
    lo, hi = np.datetime64(pd.Timestamp.min.ceil("s")), np.datetime64(pd.Timestamp.max.floor("s"))
    out = np.flatnonzero((naive < lo) | (naive > hi))  # nanosecond times cover 1677-09-22 .. 2262-04-11
    if out.size:
        raise DataError(f"{where}: column '{name}': time {col.iloc[out[0]]!r} ({_row(out[0])}) is outside "
                        f"the years 1678..2261 that nanosecond times hold")
    return naive.astype("datetime64[ns]")


def _numbers(col: pd.Series, name: str, where: str, lo: float, hi: float, allow_nan: bool = False) -> np.ndarray:
    x = pd.to_numeric(col, errors="coerce").to_numpy(dtype=np.float64)
    bad = np.flatnonzero((np.isnan(x) & (not allow_nan)) | (x < lo) | (x > hi))
    if bad.size:
        i = bad[0]
        raise DataError(f"{where}: column '{name}': {col.iloc[i]!r} ({_row(i)}) is not a number in [{lo:g}, {hi:g}]")
    return x


def _ids(col: pd.Series, name: str, where: str) -> np.ndarray:
    if col.isna().any():
        i = int(np.flatnonzero(col.isna().to_numpy())[0])
        raise DataError(f"{where}: column '{name}': empty station id ({_row(i)})")
    if pd.api.types.is_float_dtype(col) and np.all(np.mod(col.to_numpy(), 1) == 0):
        col = col.astype(np.int64)  # 10001.0 (a CSV column of integers with gaps elsewhere) -> "10001"
    return col.astype(str).str.strip().to_numpy()


def prepare_obs(source: str | Path, out: str | Path, stream: str, variables: list[str] | tuple[str, ...] = (),
                step_hours: float = 6.0, noise: dict[str, float] | None = None, description: str = "",
                overwrite: bool = False, bounds: dict[str, tuple[float, float]] | None = None) -> PrepareObsResult:
    """Convert the table `source` into the point stream `stream` of the obs dir `out` (see the module doc)."""
    source, out = Path(source), Path(out)
    check_name(stream, "config key 'stream'")
    where = f"source {source}"
    reg = open_registry(out) if (out / REGISTRY).exists() else empty_registry(out)
    if stream in reg.streams and not overwrite:
        raise DataError(f"obs dir {out} already has a stream '{stream}' (set overwrite=true to replace it)")
    df = read_table(source)
    if df.empty:
        raise DataError(f"{where}: the table has no rows")
    roles = _columns(df, where)
    var_cols = _variables(df, roles, list(variables), where)
    for k in (noise or {}):
        if long_name(k) not in var_cols:
            raise ConfigError(f"config key 'noise.{k}' names no variable of the stream ({', '.join(var_cols)})")
    rows = pd.DataFrame({
        STATION: _ids(df[roles[STATION]], roles[STATION], where),
        TIME: _times(df[roles[TIME]], roles[TIME], where),
        LAT: _numbers(df[roles[LAT]], roles[LAT], where, -90.0, 90.0),
    })
    lon = np.mod(_numbers(df[roles[LON]], roles[LON], where, -180.0, 360.0), 360.0).astype(np.float32)
    rows[LON] = np.where(lon >= 360.0, np.float32(0.0), lon)  # 359.99999 rounds to 360 in float32
    key = [STATION, TIME]
    if LEVEL in roles:
        lv = _numbers(df[roles[LEVEL]], roles[LEVEL], where, 1.0, 1100.0)
        if np.any(np.mod(lv, 1) != 0):
            i = int(np.flatnonzero(np.mod(lv, 1) != 0)[0])
            raise DataError(f"{where}: column '{roles[LEVEL]}': level {lv[i]:g} ({_row(i)}) is not a whole hPa")
        rows[LEVEL] = lv.astype(np.int32)
        key.append(LEVEL)
    if ALTITUDE in roles:
        rows[ALTITUDE] = _numbers(df[roles[ALTITUDE]], roles[ALTITUDE], where, -500.0, 9000.0, allow_nan=True)
    if QUALITY in roles:
        q = _numbers(df[roles[QUALITY]], roles[QUALITY], where, 0, 2)
        if np.any(np.mod(q, 1) != 0):
            i = int(np.flatnonzero(np.mod(q, 1) != 0)[0])
            raise DataError(f"{where}: column '{roles[QUALITY]}': {q[i]:g} ({_row(i)}) is not 0 (good), 1 (suspect) "
                            f"or 2 (bad)")
        rows[QUALITY] = q.astype(np.int8)
    else:
        rows[QUALITY] = np.zeros(len(rows), np.int8)
    for k in (bounds or {}):
        if long_name(k) not in var_cols:
            raise ConfigError(f"config key 'bounds.{k}' names no variable of the stream ({', '.join(var_cols)})")
    bounds = {long_name(k): v for k, v in (bounds or {}).items()}
    for v, c in var_cols.items():
        rows[v] = _values(df[c], v, where, bounds)
    dup = rows.duplicated(key, keep=False).to_numpy()
    if dup.any():
        first = int(np.flatnonzero(dup)[0])
        same = rows[key].iloc[first]
        other = int(np.flatnonzero(dup & (rows[key] == same).all(axis=1).to_numpy())[1])
        what = ", ".join(f"{roles.get(k, k)}={rows[k].iloc[first]}" for k in key)
        raise DataError(f"{where}: duplicate rows for ({what}): {_row(first)} and {_row(other)}")
    names = list(var_cols)
    mean, std = point_stats(rows, names, where)
    step = np.timedelta64(int(round(step_hours * 3600)), "s").astype("timedelta64[ns]")
    levels = sorted({int(x) for x in rows[LEVEL]}, reverse=True) if LEVEL in rows else []
    noise_long = {long_name(k): float(v) for k, v in (noise or {}).items()}
    info = StreamInfo(stream, POINT, POINTS_PATH, names, levels, mean, std, {v: noise_long.get(v) for v in names},
                      max_per_step(report_times(rows), step),
                      description or f"point stream prepared from {source.name}")
    table = to_table(rows, names)
    # every check has passed: write the stream, then the registry that names it, under the obs dir's lock
    # and from the registry as it is now (another job may have added a stream since it was read above)
    out.mkdir(parents=True, exist_ok=True)
    with lock(out / REGISTRY_LOCK):
        reg = open_registry(out) if (out / REGISTRY).exists() else reg
        if stream in reg.streams and not overwrite:
            raise DataError(f"obs dir {out} already has a stream '{stream}' (set overwrite=true to replace it)")
        write_point_stream(out, POINTS_PATH, stream, table)
        reg.streams = {**reg.streams, stream: info}
        write_registry(reg, out)
    times = rows[TIME].to_numpy()
    return PrepareObsResult(out, info, len(rows), int(rows[STATION].nunique()),
                            str(times.min())[:19], str(times.max())[:19])
