"""Observations of assimilation windows, batch by batch: `ObsWindowReader(spec)(times) -> dict of arrays`.

An analysis at store time t uses the observations with t - W * step < time <= t (W = `spec.window_steps`).
For a batch of b analysis times, per stream s with C_s channels:

point stream (N_s = W * max_per_step slots, filled in (time, obs_id) order, zero-padded):
    obs.{s}.coords  (b, N_s, 2)    float32  latitude, longitude (degrees)
    obs.{s}.values  (b, N_s, C_s)  float32  (value - mean) / std, 0 where missing
    obs.{s}.mask    (b, N_s, C_s)  float32  1 where a value is present (and quality <= max_quality)
    obs.{s}.id      (b, N_s)       int64    obs_id, -1 for padding
    obs.{s}.altitude (b, N_s)      float32  station height (m), 0 where unknown or padding; only for streams
                                            with an `altitude` column (the station decoder's feature)
gridded stream on its own grid (h_s, w_s):
    obs.{s}.values  (b, C_s, h_s, w_s) float32  per pixel and channel the latest non-NaN value in the window,
                                                normalised, 0 where none
    obs.{s}.mask    (b, C_s, h_s, w_s) float32

A slot holds one report: a row of the stream, or for a stream with levels all rows of one (station, time),
its channels `{var}_{level}`; the slot's id is then the smallest obs_id of those rows. Rows with quality
above `max_quality` are not read at all (the filter is pushed into the scan), so mask = value present.
An empty window gives all-zero values and masks (and ids -1): the stream is "absent".

One Parquet scan per stream and call, for the whole batch, filtered on the `day` partitions the windows
touch and on their time ranges; each gridded zarr is opened once per process (the reader is pickled to Ray
tasks unopened). A window holding more reports than N_s means the registry's `max_per_step` is wrong: a
DataError, never a silent truncation.
"""

from __future__ import annotations

import numpy as np
import pyarrow.dataset as pads

from wxray.data.obs.gridded import GriddedSource, latest_valid
from wxray.data.obs.points import (
    ALTITUDE,
    LAT,
    LEVEL,
    LON,
    OBS_ID,
    STATION,
    TIME,
    open_point_dataset,
    read_windows,
)
from wxray.data.obs.registry import POINT, ObsSpec, StreamInfo
from wxray.errors import DataError


class ObsWindowReader:
    """(b,) datetime64[ns] analysis times -> the batch dict above, for every stream of `spec`."""

    def __init__(self, spec: ObsSpec):
        self.spec = spec
        self._points: dict[str, pads.Dataset] = {}
        self._grids: dict[str, GriddedSource] = {}

    def __getstate__(self) -> dict:
        # opened handles stay in the process that opened them; a copy reopens lazily
        return {"spec": self.spec, "_points": {}, "_grids": {}}

    def __call__(self, times: np.ndarray) -> dict[str, np.ndarray]:
        times = np.asarray(times).astype("datetime64[ns]").reshape(-1)
        hi = times
        lo = times - self.spec.window
        out: dict[str, np.ndarray] = {}
        for s in self.spec.streams:
            if s.kind == POINT:
                out.update(self._point(s, lo, hi))
            else:
                out.update(self._gridded(s, lo, hi))
        return out

    def _dataset(self, s: StreamInfo) -> pads.Dataset:
        if s.name not in self._points:
            self._points[s.name] = open_point_dataset(s.data_path(self.spec.obs_dir))
        return self._points[s.name]

    def _point(self, s: StreamInfo, lo: np.ndarray, hi: np.ndarray) -> dict[str, np.ndarray]:
        b, c = len(lo), s.n_channels
        n = self.spec.window_steps * s.max_per_step
        coords = np.zeros((b, n, 2), np.float32)
        values = np.zeros((b, n, c), np.float32)
        mask = np.zeros((b, n, c), np.float32)
        ids = np.full((b, n), -1, np.int64)
        has_alt = ALTITUDE in self._dataset(s).schema.names
        alt = np.zeros((b, n), np.float32)
        columns = ([OBS_ID, TIME, LAT, LON] + ([STATION, LEVEL] if s.levels else []) + list(s.variables)
                   + ([ALTITUDE] if has_alt else []))
        table = read_windows(self._dataset(s), lo, hi, columns, self.spec.max_quality) if b else None
        if table is not None and table.num_rows:
            r_id, r_time, r_coords, r_vals, r_alt = self._reports(s, table)
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
        return {**out, f"{p}.altitude": alt} if has_alt else out

    @staticmethod
    def _reports(s: StreamInfo, table) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
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

    def _gridded(self, s: StreamInfo, lo: np.ndarray, hi: np.ndarray) -> dict[str, np.ndarray]:
        if s.name not in self._grids:
            self._grids[s.name] = GriddedSource(s.data_path(self.spec.obs_dir),
                                                f"stream '{s.name}' of {self.spec.obs_dir}")
        src = self._grids[s.name]
        b, c, h, w = len(lo), s.n_channels, len(s.latitude), len(s.longitude)
        values = np.zeros((b, c, h, w), np.float32)
        mask = np.zeros((b, c, h, w), np.float32)
        windows = [src.in_window(lo[i], hi[i]) for i in range(b)]
        uniq = np.unique(np.concatenate(windows)) if b else np.empty(0, np.int64)
        stack = src.read(uniq)  # each needed step read once for the whole batch
        if stack.shape[1:] != (c, h, w):
            raise DataError(f"stream '{s.name}': {src.path} holds {stack.shape[1:]} per step, expected {(c, h, w)}")
        mean, std = s.channel_stats()
        for i, idx in enumerate(windows):
            if len(idx) == 0:
                continue
            x = latest_valid(stack[np.searchsorted(uniq, idx)])
            ok = ~np.isnan(x)
            values[i] = np.where(ok, (x - mean[:, None, None]) / std[:, None, None], 0.0)
            mask[i] = ok
        p = f"obs.{s.name}"
        return {f"{p}.values": values, f"{p}.mask": mask}


def count_reports(spec: ObsSpec, stream: StreamInfo, lo: np.datetime64, hi: np.datetime64) -> int:
    """Reports (rows, or time steps of a gridded stream) of `stream` with lo < time <= hi."""
    path = stream.data_path(spec.obs_dir)
    if stream.kind == POINT:
        t = pads.field(TIME)
        return int(open_point_dataset(path).count_rows(filter=(t > pads.scalar(lo)) & (t <= pads.scalar(hi))))
    return len(GriddedSource(path, f"stream '{stream.name}'").in_window(lo, hi))


def check_reports(spec: ObsSpec, times: np.ndarray, where: str) -> None:
    """DataError naming the stream when one of `spec` has no report in any window of the analysis `times`:
    it would train with zero observations of it, and quietly so."""
    times = np.asarray(times, dtype="datetime64[ns]")
    lo, hi = times.min() - spec.window_steps * spec.step, times.max()
    for s in spec.streams:
        if count_reports(spec, s, lo, hi) == 0:
            raise DataError(f"stream '{s.name}' of obs dir {spec.obs_dir} has no reports in the period of {where} "
                            f"({str(lo)[:16]} .. {str(hi)[:16]}): check the store and obs dir belong together, "
                            f"or leave the stream out (data.streams)")
