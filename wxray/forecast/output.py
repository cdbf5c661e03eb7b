"""Where a forecaster's forecast lands: `forecast.zarr`, laid out before the first sample is made and filled
by region as batches of (init, member) samples come out of the rollout, so memory is one batch whatever the
inits, members and leads, and a stopped run continues where it stopped.

Layout (the forecast convention, zarr v2 with consolidated metadata and CF attributes, as
`rollout.write_forecast`): one float32 variable per target variable, dims (init_time, lead_time[, member]
[, level], latitude, longitude), NaN where nothing was written. Chunks are one init x one member x
`lead_chunk` leads x one level x the whole kept grid:

* a reader of one channel at one lead (evaluate, which scores channel by channel and lead by lead, a block of
  inits at a time with all their members; a map of one init) reads that field and nothing of the other levels;
* a sample's writes replace whole chunks (no read-modify-write), so any number of writers can fill one store
  at once, each its own samples;
* `lead_chunk` = as many leads as keep a chunk under `CHUNK_BYTES` (1 MiB), at least 1, at most
  `MAX_LEAD_CHUNK`: a field of a real grid (0.25 degrees: 4.2 MB; 1 degree: 1 MB) is a chunk of its own, so a
  per-lead reader reads nothing twice; only small fields (8 leads of a 64 x 128 field: 256 KB) are grouped,
  so that a toy forecast is not hundreds of thousands of tiny files. A batch holds that many leads before
  writing them.

While a run goes the store is `forecast.zarr.partial` beside `samples_done.jsonl` (a first line with the
run's fingerprint, then one line per batch whose every lead is written, appended only after its chunks are:
the driver's cost per batch does not grow with the run; a line cut short by a crash is ignored). A re-run into
the same directory with the same fingerprint makes only the samples not listed; one with another fingerprint is
refused; when every sample is in, the store is renamed `forecast.zarr`: a store under the final name is always complete
(`wxray_fingerprint` in its attributes says which run wrote it, and a re-run of that run computes nothing).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dask.array as da
import numpy as np
import pandas as pd
import xarray as xr
import zarr

from wxray.data.cf import describe
from wxray.data.schema import INIT, LAT, LEAD, LEVEL, LON, MEMBER
from wxray.data.windows import WindowSpec
from wxray.errors import DataError
from wxray.forecast.rollout import Sample, channel_groups, samples_of
from wxray.io import atomic_path

NAME, DONE = "forecast.zarr", "samples_done.jsonl"
FINGERPRINT = "wxray_fingerprint"
CHUNK_BYTES = 2**20
MAX_LEAD_CHUNK = 8


@dataclass(frozen=True)
class ForecastLayout:
    """The coordinates of a forecast: its inits, leads, members (None: one deterministic forecast, no
    `member` dim), target channels and kept grid, with the attributes the store carries."""

    spec: WindowSpec
    init_times: np.ndarray
    leads: pd.TimedeltaIndex
    members: tuple[int, ...] | None = None
    var_attrs: dict[str, dict[str, str]] = field(default_factory=dict)  # variable -> units, long_name
    attrs: dict[str, Any] = field(default_factory=dict)

    @property
    def lead_chunk(self) -> int:
        field_bytes = 4 * int(np.prod(self.spec.kept_grid))
        return max(1, min(len(self.leads), MAX_LEAD_CHUNK, CHUNK_BYTES // field_bytes))

    def samples(self) -> list[Sample]:
        """Every (init index, member id), init by init."""
        return samples_of(len(self.init_times), self.members)

    def member_index(self, m: int) -> int:
        return 0 if self.members is None else self.members.index(m)

    def groups(self) -> list[tuple[str, list[int], list[int] | None]]:
        """(variable, target channel indices, levels or None) in the targets' order."""
        return channel_groups(self.spec.targets)

    def fingerprint(self) -> str:
        """What a re-run must share to continue a partial store: inits, leads, members, channels, grid, attrs."""
        text = json.dumps({"inits": [str(t) for t in self.init_times], "leads": [str(t) for t in self.leads],
                           "members": self.members, "channels": [c.name for c in self.spec.targets],
                           "grid": [list(map(float, self.spec.latitude)), list(map(float, self.spec.longitude))],
                           "attrs": self.attrs}, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def template(self) -> xr.Dataset:
        """The all-NaN store, lazily (nothing of its size is ever in memory)."""
        lead_dims = (INIT, LEAD) if self.members is None else (INIT, LEAD, MEMBER)
        sizes = [len(self.init_times), len(self.leads)] + ([] if self.members is None else [len(self.members)])
        chunks = [1, self.lead_chunk] + ([] if self.members is None else [1])
        h, w = self.spec.kept_grid
        coords: dict[str, Any] = {INIT: self.init_times, LEAD: self.leads, LAT: self.spec.latitude,
                                  LON: self.spec.longitude}
        if self.members is not None:
            coords[MEMBER] = np.asarray(self.members, dtype=np.int64)
        data = {}
        for var, _, levels in self.groups():
            if levels is None:
                arr = da.full((*sizes, h, w), np.nan, dtype=np.float32, chunks=(*chunks, h, w))
                data[var] = xr.DataArray(arr, dims=(*lead_dims, LAT, LON))
            else:
                arr = da.full((*sizes, len(levels), h, w), np.nan, dtype=np.float32, chunks=(*chunks, 1, h, w))
                data[var] = xr.DataArray(arr, dims=(*lead_dims, LEVEL, LAT, LON), coords={LEVEL: levels})
            data[var].attrs.update(self.var_attrs.get(var, {}))
        ds = xr.Dataset(data, coords=coords, attrs={**self.attrs, FINGERPRINT: self.fingerprint()})
        ds.attrs.update(source="wxray rollout", grid_fit=self.spec.fit.mode,
                        routing_members=1 if self.members is None else len(self.members))
        return describe(ds)


class ForecastStore:
    """`out_dir`'s forecast.zarr as the module docstring lays it out: open (create or continue), write, finish.
    Only the driver opens, records and finishes; `write` may run anywhere that sees `out_dir` (Ray actors on a
    shared file system), each writer its own samples."""

    def __init__(self, out_dir: str | Path, layout: ForecastLayout):
        self.out_dir, self.layout = Path(out_dir), layout
        self.fingerprint = layout.fingerprint()
        self.done: set[Sample] = set()
        self.complete = False
        self._root = None

    @property
    def final(self) -> Path:
        return self.out_dir / NAME

    @property
    def partial(self) -> Path:
        return self.out_dir / (NAME + ".partial")

    def _finished(self) -> bool:
        try:
            attrs = zarr.open_group(str(self.final), mode="r", zarr_format=2).attrs
        except (FileNotFoundError, zarr.errors.NodeNotFoundError, ValueError):
            return False
        return attrs.get(FINGERPRINT) == self.fingerprint

    def open(self) -> set[Sample]:
        """Create the partial store, or continue an interrupted run's with the same fingerprint. Returns the
        samples already written: all of them when this very run finished before."""
        done_file = self.out_dir / DONE
        if self._finished():
            self.complete = True
            done_file.unlink(missing_ok=True)  # a run stopped between its rename and this file's removal
            self.done = set(self.layout.samples())
            return set(self.done)
        if done_file.is_file():
            text = done_file.read_text()
            if not text.endswith("\n"):  # a crash cut the last line short: the next line starts afresh
                with open(done_file, "a") as f:
                    f.write("\n")
            head, *batches = text.splitlines()
            theirs = json.loads(head).get("fingerprint")
            if theirs != self.fingerprint or not self.partial.is_dir():
                raise DataError(f"{self.out_dir}: holds a partial forecast with other settings (fingerprint "
                                f"{theirs} != {self.fingerprint}); give another out_dir")
            for line in batches:
                try:
                    self.done.update((int(a), int(m)) for a, m in json.loads(line))
                except ValueError:  # the line a crash cut short: its batch is made again
                    continue
            return set(self.done)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.layout.template().to_zarr(self.partial, mode="w", compute=False, zarr_format=2, consolidated=True)
        with atomic_path(done_file) as tmp:
            tmp.write_text(json.dumps({"fingerprint": self.fingerprint}) + "\n")
        return set()

    def write(self, batch: Sequence[Sample], k0: int, block: np.ndarray) -> None:
        """Leads k0 .. k0 + L - 1 of the samples `batch`: block (len(batch), L, V_out, h, w), L a whole lead
        chunk (or the last leads). Each sample's chunks are replaced whole; consecutive members of one init
        go in one write (zarr writes their chunks concurrently)."""
        if self._root is None:
            self._root = zarr.open_group(str(self.partial), mode="r+", zarr_format=2)
        lay = self.layout
        leads = slice(k0, k0 + block.shape[1])
        for start, stop in _runs(batch, lay):
            a, m0 = batch[start][0], lay.member_index(batch[start][1])
            part = np.moveaxis(block[start:stop], 0, 1)  # (L, samples, V_out, h, w): the store's lead-member order
            for var, idx, levels in lay.groups():
                values = part[:, :, idx] if levels is not None else part[:, :, idx[0]]
                if lay.members is None:
                    self._root[var][a, leads] = values[:, 0]
                else:
                    self._root[var][a, leads, m0: m0 + stop - start] = values

    def record(self, batch: Iterable[Sample]) -> None:
        """`batch` has every lead written: listed, so a re-run skips it."""
        batch = list(batch)
        self.done.update(batch)
        with open(self.out_dir / DONE, "a") as f:
            f.write(json.dumps([[int(a), int(m)] for a, m in batch]) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def finish(self) -> Path:
        """Rename the complete partial store to forecast.zarr (an older one is replaced), drop the list."""
        if not self.complete:
            missing = len(self.layout.samples()) - len(self.done)
            if missing:
                raise DataError(f"{self.partial}: {missing} sample(s) not written; re-run into {self.out_dir}")
            with atomic_path(self.final) as tmp:
                self.partial.rename(tmp)
        (self.out_dir / DONE).unlink(missing_ok=True)
        return self.final


def _runs(batch: Sequence[Sample], layout: ForecastLayout) -> list[tuple[int, int]]:
    """[start, stop) of the batch's runs of one init's consecutive members."""
    runs, start = [], 0
    for k in range(1, len(batch) + 1):
        if k == len(batch) or batch[k][0] != batch[k - 1][0] or \
                layout.member_index(batch[k][1]) != layout.member_index(batch[k - 1][1]) + 1:
            runs.append((start, k))
            start = k
    return runs
