"""Helpers of the observation-stream tests: small stores, hand-made obs dirs, file listings."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

from wxray.data.obs.gridded import write_gridded
from wxray.data.obs.kinds.gridded import GRIDDED
from wxray.data.obs.kinds.point import POINT, POINTS_PATH
from wxray.data.obs.points import max_per_step, point_stats, report_times, to_table, write_point_stream
from wxray.data.obs.registry import Registry, StreamInfo, write_registry
from wxray.data.stats import add_stats
from wxray.data.writer import StoreWriter

SMALL = {"grid": (16, 32), "days": 2, "trajectories": 2, "spinup_days": 1}
STEP = np.timedelta64(6, "h")
T0 = np.datetime64("2000-01-01T00:00", "ns")


def listing(root: Path) -> dict[str, bytes | None]:
    """Every path under `root` with its bytes (None for folders)."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def write_level_store(path: Path, n_times: int = 8, grid: tuple[int, int] = (9, 16),
                      levels: tuple[int, ...] = (1000, 850, 500, 250)) -> xr.Dataset:
    """A tiny global store with pressure levels (geopotential, temperature, u, v) and its stats."""
    rng = np.random.default_rng(0)
    lat = np.linspace(-90, 90, grid[0])
    lon = np.arange(grid[1]) * 360.0 / grid[1]
    base = {"geopotential": 5e4, "temperature": 250.0, "u_component_of_wind": 10.0, "v_component_of_wind": 0.0}
    scale = {"geopotential": 1e3, "temperature": 5.0, "u_component_of_wind": 5.0, "v_component_of_wind": 5.0}
    shape = (n_times, len(levels), *grid)
    data = {v: (("time", "level", "latitude", "longitude"),
                (base[v] + scale[v] * rng.standard_normal(shape)).astype(np.float32)) for v in base}
    ds = xr.Dataset(data, coords={"time": pd.date_range("2000-01-01", periods=n_times, freq="6h").values,
                                  "level": np.asarray(levels, np.int64), "latitude": lat, "longitude": lon})
    w = StoreWriter(path)
    w.write(ds)
    add_stats(path, progress=False)
    w.finish({})
    return ds


def point_stream(name: str, rows: list[dict], variables: list[str], step=STEP, **kw) -> tuple[StreamInfo, object]:
    """A StreamInfo with statistics from `rows` (dicts of columns) and its table."""
    df = pd.DataFrame(rows)
    df["time"] = pd.to_datetime(df["time"]).to_numpy().astype("datetime64[ns]")
    df["quality"] = (df["quality"].fillna(0) if "quality" in df else 0) * np.ones(len(df))
    df["quality"] = df["quality"].astype(np.int8)
    for v in variables:
        df[v] = df[v].astype(np.float32)
    mean, std = point_stats(df, variables, name)
    most = kw.pop("max_per_step", None) or max_per_step(report_times(df), step)
    info = StreamInfo(name, POINT, POINTS_PATH, variables, kw.pop("levels", []), mean, std,
                      {v: None for v in variables}, most, **kw)
    return info, to_table(df, variables)


def write_obs_dir(obs_dir: Path, points: list[tuple[StreamInfo, object]] = (),
                  gridded: list[tuple[StreamInfo, np.ndarray, np.ndarray]] = ()) -> Registry:
    """An obs dir holding the given point streams (info, table) and gridded streams (info, times, values)."""
    obs_dir.mkdir(parents=True, exist_ok=True)
    streams = {}
    for info, table in points:
        write_point_stream(obs_dir, POINTS_PATH, info.name, table)
        streams[info.name] = info
    for info, times, values in gridded:
        assert info.kind == GRIDDED
        write_gridded(obs_dir / info.path, times, info.variables, info.latitude, info.longitude, values)
        streams[info.name] = info
    reg = Registry(obs_dir, streams)
    write_registry(reg)
    return reg
