"""Point streams: reports at scattered positions (stations, ships, radiosonde-like profiles), in the shared Parquet
dataset `points/` of an obs dir (hive: stream=<name>/day=YYYY-MM-DD/; `wxray.data.obs.points`).

Windows of a batch of b analysis times, per stream s with C_s channels and N_s = W * max_per_step slots, filled
in (time, obs_id) order and zero-padded (W = `spec.window_steps`):

    obs.{s}.coords   (b, N_s, 2)    float32  latitude, longitude (degrees)
    obs.{s}.values   (b, N_s, C_s)  float32  (value - mean) / std, 0 where missing
    obs.{s}.mask     (b, N_s, C_s)  float32  1 where a value is present (and quality <= max_quality)
    obs.{s}.id       (b, N_s)       int64    obs_id, -1 for padding
    obs.{s}.altitude (b, N_s)       float32  station height (m), 0 where unknown or padding; only for streams
                                             with an `altitude` column (the station decoder's feature)

A slot holds one report: a row of the stream, or for a stream with levels all rows of one (station, time),
its channels `{var}_{level}`; the slot's id is then the smallest obs_id of those rows. Rows with quality above
`max_quality` are not read at all (the filter is pushed into the scan), so mask = value present. One Parquet
scan per stream and batch, filtered on the `day` partitions the windows touch and on their time ranges. A
window holding more reports than N_s means obs.yaml's `max_per_step` is wrong: a DataError, never a silent
truncation. The encoder embeds these windows points -> grid.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.dataset as pads

from wxray.data import location
from wxray.data.obs.kinds.base import StreamKind
from wxray.data.obs.points import (
    ALTITUDE,
    LAT,
    LEVEL,
    LON,
    OBS_ID,
    STATION,
    STREAM,
    TIME,
    open_point_dataset,
    read_windows,
)
from wxray.data.obs.stream import ObsSpec, StreamInfo
from wxray.errors import DataError

POINT = "point"
POINTS_PATH = "points"  # the Parquet dataset root every point stream of an obs dir shares


class PointKind(StreamKind):
    name = POINT
    embedding = "points_to_grid"
    required = ("coords", "values", "mask", "id")
    optional = (ALTITUDE,)
    levels = True
    min_per_step = 1  # N_s = W * max_per_step slots: a point stream needs at least one
    stations = True

    def data_path(self, info: StreamInfo, obs_dir: str | Path) -> str:
        """The stream's hive directory `<path>/stream=<name>` of the shared dataset."""
        return location.join(location.join(obs_dir, info.path), f"{STREAM}={info.name}")

    def keys(self, info: StreamInfo, obs_dir: str | Path) -> tuple[str, ...]:
        has_alt = ALTITUDE in open_point_dataset(self.data_path(info, obs_dir)).schema.names
        return self.required + ((ALTITUDE,) if has_alt else ())

    def window_reader(self, info: StreamInfo, spec: ObsSpec) -> PointWindows:
        return PointWindows(info, spec, open_point_dataset(self.data_path(info, spec.obs_dir)))

    def count_reports(self, info: StreamInfo, obs_dir: str | Path, lo: np.datetime64, hi: np.datetime64) -> int:
        t = pads.field(TIME)
        dataset = open_point_dataset(self.data_path(info, obs_dir))
        return int(dataset.count_rows(filter=(t > pads.scalar(lo)) & (t <= pads.scalar(hi))))


class PointWindows:
    """The windows of one point stream (the module docstring's arrays), from its opened dataset."""

    def __init__(self, info: StreamInfo, spec: ObsSpec, dataset: pads.Dataset):
        self.info, self.spec, self.dataset = info, spec, dataset

    def __call__(self, lo: np.ndarray, hi: np.ndarray) -> dict[str, np.ndarray]:
        s = self.info
        b, c = len(lo), s.n_channels
        n = self.spec.window_steps * s.max_per_step
        coords = np.zeros((b, n, 2), np.float32)
        values = np.zeros((b, n, c), np.float32)
        mask = np.zeros((b, n, c), np.float32)
        ids = np.full((b, n), -1, np.int64)
        has_alt = ALTITUDE in self.dataset.schema.names
        alt = np.zeros((b, n), np.float32)
        columns = ([OBS_ID, TIME, LAT, LON] + ([STATION, LEVEL] if s.levels else []) + list(s.variables)
                   + ([ALTITUDE] if has_alt else []))
        table = read_windows(self.dataset, lo, hi, columns, self.spec.max_quality) if b else None
        if table is not None and table.num_rows:
            r_id, r_time, r_coords, r_vals, r_alt = reports(s, table)
            mean, std = s.channel_stats()
            present = ~np.isnan(r_vals)
            r_norm = np.where(present, (r_vals - mean) / std, 0.0).astype(np.float32)
            for i in range(b):
                a = np.searchsorted(r_time, lo[i], side="right")
                z = np.searchsorted(r_time, hi[i], side="right")
                k = z - a
                if k > n:
                    raise DataError(f"stream '{s.name}' of {self.spec.obs_dir}: {k} reports in the window "
                                    f"ending {hi[i]}, more than window_steps * max_per_step = {n} (obs.yaml's "
                                    f"max_per_step is too small)")
                coords[i, :k] = r_coords[a:z]
                values[i, :k] = r_norm[a:z]
                mask[i, :k] = present[a:z]
                ids[i, :k] = r_id[a:z]
                alt[i, :k] = r_alt[a:z]
        p = f"obs.{s.name}"
        out = {f"{p}.coords": coords, f"{p}.values": values, f"{p}.mask": mask, f"{p}.id": ids}
        return {**out, f"{p}.{ALTITUDE}": alt} if has_alt else out


def reports(s: StreamInfo, table) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per report, sorted by (time, obs_id): ids, times, (lat, lon), channel values (NaN = missing),
    altitude (0 where unknown or without the column)."""
    obs_id = table[OBS_ID].to_numpy()
    t = table[TIME].to_numpy().astype("datetime64[ns]")
    lat = table[LAT].to_numpy().astype(np.float32)
    lon = table[LON].to_numpy().astype(np.float32)
    vals = np.stack([table[v].to_numpy(zero_copy_only=False).astype(np.float32) for v in s.variables], 1)
    alt = (np.nan_to_num(table[ALTITUDE].to_numpy(zero_copy_only=False).astype(np.float32))
           if ALTITUDE in table.column_names else np.zeros(len(t), np.float32))
    if s.levels:
        # one report per (station, time): its rows' levels become channels {var}_{level}, variable-major
        station = table[STATION].to_numpy(zero_copy_only=False).astype(str)
        level = table[LEVEL].to_numpy()
        keep = np.isin(level, s.levels)
        obs_id, t, lat, lon, vals, station, level, alt = (x[keep] for x in (obs_id, t, lat, lon, vals, station,
                                                                            level, alt))
        _, st_code = np.unique(station, return_inverse=True)
        key = np.stack([t.view(np.int64), st_code.astype(np.int64)], 1)
        uniq, first, inv = np.unique(key, axis=0, return_index=True, return_inverse=True)
        inv = inv.reshape(-1)
        n_rep, n_lev = len(uniq), len(s.levels)
        rep_vals = np.full((n_rep, len(s.variables), n_lev), np.nan, np.float32)
        li = np.searchsorted(np.sort(s.levels), level)
        li = np.argsort(s.levels)[li]  # the position of each row's level in s.levels
        rep_vals[inv, :, li] = vals
        rep_id = np.full(n_rep, np.iinfo(np.int64).max, np.int64)
        np.minimum.at(rep_id, inv, obs_id)
        obs_id, t, lat, lon, alt = rep_id, t[first], lat[first], lon[first], alt[first]
        vals = rep_vals.reshape(n_rep, -1)
    order = np.lexsort((obs_id, t))
    return obs_id[order], t[order], np.stack([lat, lon], 1)[order], vals[order], alt[order]
