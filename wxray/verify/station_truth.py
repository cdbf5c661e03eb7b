"""Station truth: a point stream of an obs dir (the data contract of `wxray.data.obs`), read for verification.

An obs dir holds `obs.yaml` (read and checked by `wxray.data.obs.registry.open_registry`) and, for a point stream,
a hive Parquet dataset `<path>/stream=<name>/day=YYYY-MM-DD/*.parquet` with columns time, station, latitude,
longitude, [level], one per variable (NaN: not reported) and quality (0 good, 1 suspect, 2 bad). Read here
with pyarrow directly (verification needs no windows), only the days of the wanted valid times; the obs dir may
be a URL (`wxray.data.location`: read in place through its fsspec filesystem).
A station forecast row pairs with the observation of the same station, channel and valid time
init_time + lead_time exactly, when its quality <= max_quality and its value is reported.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as pads

from wxray.data import location
from wxray.data.dims import INIT, LEAD
from wxray.data.obs.kinds import kind_of, station_kinds
from wxray.data.obs.registry import REGISTRY, StreamInfo, open_registry
from wxray.data.sources import first_line
from wxray.errors import DataError


def point_stream(obs_dir: str | Path, stream: str) -> StreamInfo:
    """Point stream `stream` of obs dir `obs_dir` as its registry describes it (at a path or a URL)."""
    if not location.reachable(obs_dir, "obs dir"):
        raise DataError(f"obs dir {obs_dir} does not exist")
    info = open_registry(obs_dir).select([stream])[0]
    if not kind_of(info).stations:
        raise DataError(f"{location.join(obs_dir, REGISTRY)}: stream '{stream}' is {info.kind}; station truth "
                        f"needs a {' or '.join(station_kinds())} stream")
    return info


def read_station_truth(obs_dir: str | Path, stream: str, valid_times: np.ndarray | None = None,
                       max_quality: int = 0) -> pd.DataFrame:
    """Observations of point stream `stream` as a long table (station, valid_time, variable, truth): only
    quality <= max_quality and reported values; at `valid_times` only (their days read, hive pruning).
    With levels the variable is the channel name `{var}_{level}`. DataError on a duplicate observation."""
    return _read_truth(obs_dir, point_stream(obs_dir, stream), valid_times, max_quality)


def _read_truth(obs_dir: str | Path, info: StreamInfo, valid_times: np.ndarray | None,
                max_quality: int) -> pd.DataFrame:
    stream = info.name
    root = location.join(obs_dir, info.path)
    variables = list(info.variables)
    part = pads.partitioning(pa.schema([("stream", pa.string()), ("day", pa.string())]), flavor="hive")
    where = f"stream '{stream}' of {location.join(obs_dir, REGISTRY)}"
    fs, inside = location.arrow_filesystem(root)
    try:
        data = pads.dataset(inside, filesystem=fs, format="parquet", partitioning=part)
        cols = ["station", "time", "quality", *variables] + (["level"] if info.levels else [])
        missing = [c for c in cols if c not in data.schema.names]
        if missing:
            raise DataError(f"{where}: parquet lacks column(s) {', '.join(missing)} under {root}")
        flt = pads.field("stream") == stream
        if valid_times is not None:
            days = sorted({str(d) for d in pd.DatetimeIndex(valid_times).strftime("%Y-%m-%d")})
            flt = flt & pads.field("day").isin(days)
        df = data.to_table(columns=cols, filter=flt & (pads.field("quality") <= max_quality)).to_pandas()
    except DataError:
        raise
    except Exception as e:  # pyarrow: unreadable file, mismatched schemas across parts
        raise DataError(f"{where}: cannot be read under {root} ({first_line(e)})") from None
    df["valid_time"] = pd.to_datetime(df.pop("time")).astype("datetime64[ns]")
    df["station"] = df["station"].astype(str)
    if valid_times is not None:
        df = df[df["valid_time"].isin(pd.DatetimeIndex(valid_times))]
    ids = ["station", "valid_time"] + (["level"] if "level" in df else [])
    long = df.melt(id_vars=ids, value_vars=variables, var_name="variable", value_name="truth").dropna(subset=["truth"])
    if "level" in long:
        long["variable"] = long["variable"] + "_" + long.pop("level").astype(np.int64).astype(str)
    long["truth"] = long["truth"].astype(np.float64)
    dup = long.duplicated(["station", "valid_time", "variable"])
    if dup.any():
        r = long[dup].iloc[0]
        raise DataError(f"{where}: two good observations of station {r.station}, {r.variable} at {r.valid_time}")
    return long.reset_index(drop=True)


def pair_with_truth(forecasts: pd.DataFrame, obs_dir: str | Path, stream: str, what: str,
                    max_quality: int = 0) -> pd.DataFrame:
    """The forecast rows that have an observation at (station, variable, valid_time = init + lead), with
    columns `valid_time` and `truth` added. DataError on variables the stream lacks or no pair at all."""
    info = point_stream(obs_dir, stream)  # the registry read once: it checks every stream's data
    have = info.channels
    unknown = sorted(set(forecasts["variable"]) - set(have))
    if unknown:
        raise DataError(f"{what}: variable(s) {', '.join(unknown)} not observed by stream '{stream}' of "
                        f"{location.join(obs_dir, REGISTRY)} (has: {', '.join(have) or 'none'})")
    fc = forecasts.assign(valid_time=forecasts[INIT] + pd.to_timedelta(forecasts[LEAD], unit="h"))
    truth = _read_truth(obs_dir, info, fc["valid_time"].unique(), max_quality)
    paired = fc.merge(truth, on=["station", "valid_time", "variable"], how="inner")
    if paired.empty:
        vt = fc["valid_time"]
        raise DataError(f"{what}: no (station, valid_time) pair with a good observation in stream '{stream}' of "
                        f"{obs_dir} (forecast: {fc['station'].nunique()} stations, valid times {vt.min()} to "
                        f"{vt.max()}; the stream has {truth['station'].nunique()} stations reporting then)")
    return paired.sort_values([INIT, LEAD, "station", "variable"]).reset_index(drop=True)
