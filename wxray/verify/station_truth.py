"""Station truth: a point stream of an obs dir (the data contract of `wxray.data.obs`), read for verification.

An obs dir holds `obs.yaml` (`streams.<name>`: kind, path, variables, levels, ...) and, for a point stream,
a hive Parquet dataset `<path>/stream=<name>/day=YYYY-MM-DD/*.parquet` with columns time, station, latitude,
longitude, [level], one per variable (NaN: not reported) and quality (0 good, 1 suspect, 2 bad). Read here
with pyarrow and yaml directly (verification needs no windows), only the days of the wanted valid times; the
obs dir may be a URL (`wxray.data.location`: read in place through its fsspec filesystem).
A station forecast row pairs with the observation of the same station, channel and valid time
init_time + lead_time exactly, when its quality <= max_quality and its value is reported.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from wxray.data import location
from wxray.data.dims import INIT, LEAD
from wxray.data.sources import first_line
from wxray.errors import DataError

POINT = "point"


def point_stream(obs_dir: str | Path, stream: str) -> tuple[str, dict[str, Any]]:
    """(parquet dataset root, registry entry) of point stream `stream` in obs dir `obs_dir` (its obs.yaml),
    both at a path or a URL."""
    import yaml

    reg_path = location.join(obs_dir, "obs.yaml")
    if not location.reachable(obs_dir, "obs dir"):
        raise DataError(f"obs dir {obs_dir} does not exist")
    if not location.exists(reg_path):
        raise DataError(f"obs dir {obs_dir}: no obs.yaml (the stream registry)")
    try:
        reg = yaml.safe_load(location.read_text(reg_path))
    except yaml.YAMLError as e:
        raise DataError(f"{reg_path}: not valid YAML ({str(e).splitlines()[0]})") from None
    streams = reg.get("streams") if isinstance(reg, dict) else None
    if not isinstance(streams, dict):
        raise DataError(f"{reg_path}: key 'streams' must map stream names to their entries")
    if stream not in streams:
        raise DataError(f"{reg_path}: stream '{stream}' not in streams (has: {', '.join(map(str, streams)) or 'none'})")
    info = streams[stream]
    if not isinstance(info, dict) or info.get("kind") != POINT or not info.get("path"):
        raise DataError(f"{reg_path}: stream '{stream}' must be kind: point with a path "
                        f"(got kind {info.get('kind') if isinstance(info, dict) else info!r})")
    root = location.join(obs_dir, str(info["path"]))
    data = location.join(root, f"stream={stream}")
    if not location.exists(data):
        raise DataError(f"{reg_path}: stream '{stream}' has no data under {data}")
    return root, info


def read_station_truth(obs_dir: str | Path, stream: str, valid_times: np.ndarray | None = None,
                       max_quality: int = 0) -> pd.DataFrame:
    """Observations of point stream `stream` as a long table (station, valid_time, variable, truth): only
    quality <= max_quality and reported values; at `valid_times` only (their days read, hive pruning).
    With levels the variable is the channel name `{var}_{level}`. DataError on a duplicate observation."""
    import pyarrow as pa
    import pyarrow.dataset as pads

    root, info = point_stream(obs_dir, stream)
    variables = [str(v) for v in info.get("variables") or []]
    part = pads.partitioning(pa.schema([("stream", pa.string()), ("day", pa.string())]), flavor="hive")
    where = f"stream '{stream}' of {location.join(obs_dir, 'obs.yaml')}"
    fs, inside = location.arrow_filesystem(root)
    try:
        data = pads.dataset(inside, filesystem=fs, format="parquet", partitioning=part)
        cols = ["station", "time", "quality", *variables] + (["level"] if info.get("levels") else [])
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


def stream_channels(info: dict[str, Any]) -> list[str]:
    """A point stream's channel names (contract: variable-major `{var}_{level}` with levels)."""
    variables, levels = [str(v) for v in info.get("variables") or []], list(info.get("levels") or [])
    return [f"{v}_{int(lv)}" for v in variables for lv in levels] if levels else variables


def pair_with_truth(forecasts: pd.DataFrame, obs_dir: str | Path, stream: str, what: str,
                    max_quality: int = 0) -> pd.DataFrame:
    """The forecast rows that have an observation at (station, variable, valid_time = init + lead), with
    columns `valid_time` and `truth` added. DataError on variables the stream lacks or no pair at all."""
    _, info = point_stream(obs_dir, stream)
    have = stream_channels(info)
    unknown = sorted(set(forecasts["variable"]) - set(have))
    if unknown:
        raise DataError(f"{what}: variable(s) {', '.join(unknown)} not observed by stream '{stream}' of "
                        f"{location.join(obs_dir, 'obs.yaml')} (has: {', '.join(have) or 'none'})")
    fc = forecasts.assign(valid_time=forecasts[INIT] + pd.to_timedelta(forecasts[LEAD], unit="h"))
    truth = read_station_truth(obs_dir, stream, fc["valid_time"].unique(), max_quality)
    paired = fc.merge(truth, on=["station", "valid_time", "variable"], how="inner")
    if paired.empty:
        vt = fc["valid_time"]
        raise DataError(f"{what}: no (station, valid_time) pair with a good observation in stream '{stream}' of "
                        f"{obs_dir} (forecast: {fc['station'].nunique()} stations, valid times {vt.min()} to "
                        f"{vt.max()}; the stream has {truth['station'].nunique()} stations reporting then)")
    return paired.sort_values([INIT, LEAD, "station", "variable"]).reset_index(drop=True)
