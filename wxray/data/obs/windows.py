"""Observations of assimilation windows, batch by batch: `ObsWindowReader(spec)(times) -> dict of arrays`.

An analysis at store time t uses the observations with t - W * step < time <= t (W = `spec.window_steps`).
For a batch of b analysis times every stream s of the spec adds its arrays `obs.{s}.<key>`, as its kind's
windows define them (`wxray.data.obs.kinds`): a point stream (`kinds/point.py`) its (b, N_s, ...) slots of
coords, values, mask, id [and altitude]; a gridded stream (`kinds/gridded.py`) values and mask on its own grid
(b, C_s, h_s, w_s). Values are normalised by the stream's statistics; mask = 1 where a value is present.
An empty window gives all-zero values and masks (and ids -1): the stream is "absent".

Each stream's reader is made once per process at its first batch (it holds the opened Parquet dataset or zarr);
the reader is pickled to Ray tasks unopened.
"""

from __future__ import annotations

import numpy as np

from wxray.data.obs.kinds import StreamWindows, kind_of
from wxray.data.obs.stream import ObsSpec, StreamInfo
from wxray.errors import DataError


class ObsWindowReader:
    """(b,) datetime64[ns] analysis times -> the batch dict above, for every stream of `spec`."""

    def __init__(self, spec: ObsSpec):
        self.spec = spec
        self._readers: dict[str, StreamWindows] = {}

    def __getstate__(self) -> dict:
        # opened handles stay in the process that opened them; a copy reopens lazily
        return {"spec": self.spec, "_readers": {}}

    def __call__(self, times: np.ndarray) -> dict[str, np.ndarray]:
        times = np.asarray(times).astype("datetime64[ns]").reshape(-1)
        hi = times
        lo = times - self.spec.window
        out: dict[str, np.ndarray] = {}
        for s in self.spec.streams:
            if s.name not in self._readers:
                self._readers[s.name] = kind_of(s).window_reader(s, self.spec)
            out.update(self._readers[s.name](lo, hi))
        return out


def count_reports(spec: ObsSpec, stream: StreamInfo, lo: np.datetime64, hi: np.datetime64) -> int:
    """Reports (rows, or time steps of a gridded stream) of `stream` with lo < time <= hi."""
    return kind_of(stream).count_reports(stream, spec.obs_dir, lo, hi)


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
