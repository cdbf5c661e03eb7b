"""Gridded streams: gappy fields on the stream's own grid (satellite swaths), one zarr `<name>.zarr` per stream
(time, channel, latitude, longitude), NaN = no data (`wxray.data.obs.gridded`).

Windows of a batch of b analysis times, per stream s with C_s channels on its grid (h_s, w_s):

    obs.{s}.values (b, C_s, h_s, w_s) float32  per pixel and channel the latest non-NaN value in the window,
                                               normalised, 0 where none
    obs.{s}.mask   (b, C_s, h_s, w_s) float32  1 where a value is present

The stream's grid is read from its zarr when obs.yaml is opened (`StreamInfo.latitude`, `.longitude`) and handed
to the encoder, which embeds these windows grid -> grid. Each time step the batch's windows need is read once.
An entry has no levels (its channels are its variables) and any `max_per_step` >= 0 (unused).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from wxray.data.obs.gridded import GriddedSource, latest_valid, read_grid
from wxray.data.obs.kinds.base import StreamKind
from wxray.data.obs.stream import ObsSpec, StreamInfo
from wxray.errors import DataError

GRIDDED = "gridded"


class GriddedKind(StreamKind):
    name = GRIDDED
    embedding = "grid_to_grid"
    required = ("values", "mask")

    def opened(self, info: StreamInfo, data: str, where: str) -> StreamInfo:
        latitude, longitude = read_grid(data, info.variables, where)
        return replace(info, latitude=latitude, longitude=longitude)

    def encoder_input(self, info: StreamInfo) -> dict[str, Any]:
        return {**super().encoder_input(info), "latitude": tuple(map(float, info.latitude)),
                "longitude": tuple(map(float, info.longitude))}

    def window_reader(self, info: StreamInfo, spec: ObsSpec) -> GriddedWindows:
        source = GriddedSource(self.data_path(info, spec.obs_dir), f"stream '{info.name}' of {spec.obs_dir}")
        return GriddedWindows(info, source)

    def count_reports(self, info: StreamInfo, obs_dir: str | Path, lo: np.datetime64, hi: np.datetime64) -> int:
        return len(GriddedSource(self.data_path(info, obs_dir), f"stream '{info.name}'").in_window(lo, hi))


class GriddedWindows:
    """The windows of one gridded stream (the module docstring's arrays), from its opened source."""

    def __init__(self, info: StreamInfo, source: GriddedSource):
        self.info, self.source = info, source

    def __call__(self, lo: np.ndarray, hi: np.ndarray) -> dict[str, np.ndarray]:
        s, src = self.info, self.source
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
