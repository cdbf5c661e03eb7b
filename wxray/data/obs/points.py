"""Point streams on disk: Parquet (pyarrow), hive-partitioned by stream and day.

    <obs dir>/points/stream=<name>/day=YYYY-MM-DD/part-0.parquet

Columns of the files (the partition columns `stream` and `day` live in the paths only):

    obs_id     int64          unique within the stream
    time       timestamp[ns]  naive UTC; `day` is its calendar day
    station    string         station / platform id
    latitude   float32        [-90, 90]
    longitude  float32        [0, 360)
    level      int32          optional (hPa): profile streams; one row per (station, time, level)
    altitude   float32        optional (m; NaN unknown)
    <variable> float32        one column per variable, NaN = not reported
    quality    int8           0 good, 1 suspect, 2 bad

Rows of a file are sorted by (time, obs_id). A stream is written whole into a hidden sibling of its
`stream=<name>` directory and renamed into place (`wxray.io.atomic_path`); pyarrow's dataset discovery skips
names starting with '.' or '_', so readers of the shared `points/` root never see half a stream.

Reads go through `pyarrow.dataset` on one stream's directory with `day` as the (string) hive partition: a
filter on `day` prunes whole directories, one on `time`/`quality` is pushed into the Parquet scan. The
directory may be a URL (`s3://bucket/obs/points/stream=<name>`): pyarrow then reads through the fsspec
filesystem of `wxray.data.location` (its endpoint, credentials and retries), fetching only the files and
row groups the filters leave.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from wxray.data import location
from wxray.data.dims import LAT, LEVEL, LON, TIME
from wxray.errors import DataError
from wxray.io import atomic_path

OBS_ID, STATION, ALTITUDE, QUALITY = "obs_id", "station", "altitude", "quality"  # and the store's dims
STREAM, DAY = "stream", "day"  # hive partition columns
GOOD, SUSPECT, BAD = 0, 1, 2
DAY_PARTITIONING = pads.partitioning(pa.schema([(DAY, pa.string())]), flavor="hive")


def point_schema(variables: list[str], level: bool = False, altitude: bool = False) -> pa.Schema:
    fields = [(OBS_ID, pa.int64()), (TIME, pa.timestamp("ns")), (STATION, pa.string()), (LAT, pa.float32()),
              (LON, pa.float32())]
    if level:
        fields.append((LEVEL, pa.int32()))
    if altitude:
        fields.append((ALTITUDE, pa.float32()))
    fields += [(v, pa.float32()) for v in variables] + [(QUALITY, pa.int8())]
    return pa.schema(fields)


def to_table(df: pd.DataFrame, variables: list[str]) -> pa.Table:
    """The stream's rows as a table of the schema above, sorted by (time, obs_id).

    `df` needs every column of the schema but `obs_id` (numbered 0.. in sorted order when absent); `level`
    and `altitude` are kept when present."""
    df = df.copy()
    if OBS_ID not in df:
        df = df.sort_values([TIME, STATION] + ([LEVEL] if LEVEL in df else []), kind="stable")
        df[OBS_ID] = np.arange(len(df), dtype=np.int64)
    df = df.sort_values([TIME, OBS_ID], kind="stable")
    schema = point_schema(variables, level=LEVEL in df, altitude=ALTITUDE in df)
    cols = {}
    for f in schema:
        x = df[f.name].to_numpy()
        if f.name == TIME:
            x = x.astype("datetime64[ns]")
        elif f.name == STATION:
            x = x.astype(str)
        cols[f.name] = pa.array(x, type=f.type)  # NaN stays NaN ("not reported"), not null
    return pa.table(cols, schema=schema)


def day_strings(times: np.ndarray) -> np.ndarray:
    return np.datetime_as_string(np.asarray(times, dtype="datetime64[ns]").astype("datetime64[D]"), unit="D")


def write_point_stream(obs_dir: str | Path, root: str, name: str, table: pa.Table) -> Path:
    """Write (or replace) stream `name` under `obs_dir/root`: one file per day, atomically as a whole."""
    final = Path(obs_dir) / root / f"{STREAM}={name}"
    days = day_strings(table[TIME].to_numpy())
    with atomic_path(final) as tmp:
        tmp.mkdir(parents=True)
        # rows are sorted by time, so each day is one contiguous slice
        starts = np.flatnonzero(np.r_[True, days[1:] != days[:-1]])
        ends = np.r_[starts[1:], len(days)]
        for a, b in zip(starts, ends):
            d = tmp / f"{DAY}={days[a]}"
            d.mkdir()
            pq.write_table(table.slice(a, b - a), d / "part-0.parquet", compression="zstd")
    return final


def open_point_dataset(path: str | Path) -> pads.Dataset:
    """One stream's directory (a path or a URL) as a dataset with the `day` partition (string)."""
    p = location.spelled(path)
    if not location.reachable(p, "point stream") or not location.is_dir(p):
        raise DataError(f"point stream {p} does not exist")
    fs, inside = location.arrow_filesystem(p)
    try:
        return pads.dataset(inside, filesystem=fs, format="parquet", partitioning=DAY_PARTITIONING)
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"point stream {p} is not a readable Parquet dataset ({str(e).splitlines()[0]})") from None


def window_days(lo: np.ndarray, hi: np.ndarray) -> list[str]:
    """The `day` partitions that rows with lo < time <= hi can lie in, over all windows (sorted)."""
    one = np.timedelta64(1, "ns")
    first = (np.asarray(lo, "datetime64[ns]") + one).astype("datetime64[D]")
    last = np.asarray(hi, "datetime64[ns]").astype("datetime64[D]")
    days = set()
    for a, b in zip(first, last):
        days.update(np.arange(a, b + np.timedelta64(1, "D"), dtype="datetime64[D]").tolist())
    return sorted(str(np.datetime64(d, "D")) for d in days)


def merge_intervals(lo: np.ndarray, hi: np.ndarray) -> list[tuple[np.datetime64, np.datetime64]]:
    """The union of half-open intervals (lo, hi] as disjoint ones, ascending."""
    out: list[list[np.datetime64]] = []
    for a, b in sorted(zip(np.asarray(lo, "datetime64[ns]"), np.asarray(hi, "datetime64[ns]"))):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def read_windows(dataset: pads.Dataset, lo: np.ndarray, hi: np.ndarray, columns: list[str],
                 max_quality: int) -> pa.Table:
    """Rows with lo_i < time <= hi_i for some i and quality <= max_quality, in one scan (filters pushed down)."""
    days = window_days(lo, hi)
    if not days:
        return dataset.schema.empty_table().select(columns)
    ts = pa.timestamp("ns")
    in_time = None
    for a, b in merge_intervals(lo, hi):
        e = (pc.field(TIME) > pa.scalar(a, ts)) & (pc.field(TIME) <= pa.scalar(b, ts))
        in_time = e if in_time is None else in_time | e
    flt = pc.field(DAY).isin(pa.array(days, pa.string())) & in_time & (pc.field(QUALITY) <= max_quality)
    try:
        return dataset.to_table(columns=columns, filter=flt)
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"point stream: cannot read {columns} ({str(e).splitlines()[0]})") from None


def max_per_step(times: np.ndarray, step: np.timedelta64) -> int:
    """The most reports in any half-open interval (s - step, s] (s anywhere, not only on a grid of steps).

    So every assimilation window of W steps, aligned with the observation times or not, holds at most
    W * max_per_step reports. `times` is one entry per report (for profiles: per (station, time))."""
    t = np.sort(np.asarray(times, dtype="datetime64[ns]"))
    if t.size == 0:
        return 0
    # the busiest interval can be taken to end on a report: count reports in (t_i - step, t_i]
    first = np.searchsorted(t, t - np.asarray(step, "timedelta64[ns]"), side="right")
    last = np.searchsorted(t, t, side="right")
    return int((last - first).max())


def report_times(df: pd.DataFrame) -> np.ndarray:
    """One time per report: per row, or per (station, time) when the stream has levels."""
    if LEVEL in df:
        return df[[STATION, TIME]].drop_duplicates()[TIME].to_numpy()
    return df[TIME].to_numpy()


def point_stats(df: pd.DataFrame, variables: list[str], where: str) -> tuple[dict[str, float], dict[str, float]]:
    """Mean and std (population) per variable over good (quality 0) reported values."""
    good = df[df[QUALITY] == GOOD] if QUALITY in df else df
    mean, std = {}, {}
    for v in variables:
        x = good[v].to_numpy(dtype=np.float64)
        x = x[np.isfinite(x)]
        if x.size == 0:
            raise DataError(f"{where}: variable '{v}' has no good (quality 0) values")
        mean[v] = float(x.mean())
        s = float(x.std())
        std[v] = s if s > 0 else max(abs(mean[v]), 1.0)  # a constant column still normalises to finite values
    return mean, std
