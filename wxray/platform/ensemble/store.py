"""Where a batch ensemble's units land: zarr stores written by coordinate, resumable, atomic at the end.

With `keep_members=true`:
    forecast.zarr   one variable per state variable, dims (init_time, lead_time, encoder_draw, dropout_draw
                    [, routing_draw] [, level], latitude, longitude), lead 0 the analysis
    stations.zarr   `station_forecast` (init_time, lead_time, encoder_draw, dropout_draw [, routing_draw],
                    station, station_variable), when the chain has a decoder
With `keep_members=false` only the nested ensemble's sufficient statistics (`verify.anova`: count, grand
mean, between / middle / within sums of squares) per (init, lead, point), in float64:
    moments.zarr    dims (init_time, lead_time, moment [, level], latitude, longitude)
    station_moments.zarr

Chunks: a member store holds one chunk per unit (init t, encoder draw i) per variable -- all N x R members,
leads and grid points of the unit -- so a unit's write replaces whole chunks (no read-modify-write) and the
file count is inits x M x variables, not one per member. Where that would pass `CHUNK_BYTES` (ERA5 grids:
a 0.25 degree field is 4 MB per member and lead) the leads are split into as few chunks as keep each under it;
a unit still covers all its leads, so its writes stay whole chunks. A moment store holds one chunk per init and
variable (leads split the same way): the driver, the only writer, merges an init's units in memory as they
arrive (Chan's parallel update) and writes the chunk once all M are in, so its size does not grow with
M x N x R and no unit is ever merged twice, however the run is interrupted.

While a run is going the stores are `<name>.partial` beside `units_done.json` (the fingerprint of the run
and the units written, each listed only after its chunks are); a re-run into the same directory with the same
fingerprint skips those units, and one whose final stores carry its fingerprint (attr `wxray_fingerprint`)
computes nothing. When every unit is in, each store is moved to its final name: a store under the final
name is always complete.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dask.array as da
import numpy as np
import pandas as pd
import xarray as xr
import zarr

from wxray.data.cf import describe
from wxray.data.schema import INIT, LAT, LEAD, LEVEL, LON
from wxray.data.windows import WindowSpec
from wxray.errors import DataError
from wxray.forecast.nested import Plan
from wxray.forecast.rollout import channel_groups
from wxray.io import atomic_path, write_json
from wxray.verify.anova import DROPOUT_DRAW, ENCODER_DRAW, MOMENT, MOMENTS, ROUTING_DRAW, merge_moments

DONE = "units_done.json"
FINGERPRINT = "wxray_fingerprint"  # store attr: which run wrote it
STATION, STATION_VARIABLE, STATION_FORECAST = "station", "station_variable", "station_forecast"


@dataclass
class Layout:
    """The coordinates of a run's output."""

    plan: Plan
    spec: WindowSpec
    init_times: np.ndarray
    step: np.timedelta64
    attrs: dict[str, Any] = field(default_factory=dict)
    stations: pd.DataFrame | None = None  # station, latitude, longitude
    station_variables: list[str] = field(default_factory=list)
    units: dict[str, str] = field(default_factory=dict)  # variable -> units

    @property
    def member_dims(self) -> tuple[str, ...]:
        return (ENCODER_DRAW, DROPOUT_DRAW) + ((ROUTING_DRAW,) if self.plan.members_r > 1 else ())

    def channel_groups(self) -> list[tuple[str, list[int], list | None]]:
        """(variable, channel indices, levels or None) of the state, in the spec's order."""
        return channel_groups(self.spec.inputs)

    def coords(self) -> dict[str, Any]:
        p = self.plan
        out = {INIT: self.init_times, LEAD: pd.to_timedelta([self.step * k for k in range(p.lead_steps + 1)]),
               ENCODER_DRAW: np.arange(p.members_m), DROPOUT_DRAW: np.arange(p.members_n),
               LAT: self.spec.latitude, LON: self.spec.longitude}
        if p.members_r > 1:
            out[ROUTING_DRAW] = np.arange(p.members_r)
        return out

    def fingerprint(self) -> str:
        """What must match for a re-run to continue a partial run: plan, inits, grid, checkpoints."""
        text = json.dumps({"plan": self.plan.__dict__, "inits": [str(t) for t in self.init_times],
                           "grid": [list(map(float, self.spec.latitude)), list(map(float, self.spec.longitude))],
                           "attrs": self.attrs}, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


CHUNK_BYTES = 64 * 2**20  # the largest chunk a store is given (zarr / object-store guidance: tens of MB)


def _empty(shape: tuple[int, ...], chunks: tuple[int, ...], dtype) -> da.Array:
    """An all-NaN template; the lead axis (1) of `chunks` is cut so that no chunk passes CHUNK_BYTES."""
    per_lead = int(np.prod([c for k, c in enumerate(chunks) if k != 1])) * np.dtype(dtype).itemsize
    leads = max(1, min(chunks[1], CHUNK_BYTES // max(per_lead, 1)))
    return da.full(shape, np.nan, dtype=dtype, chunks=(chunks[0], leads, *chunks[2:]))


def _field_template(layout: Layout, moments: bool) -> xr.Dataset:
    c = layout.coords()
    n_init, n_lead = len(layout.init_times), len(c[LEAD])
    h, w = len(c[LAT]), len(c[LON])
    if moments:
        k = len(MOMENTS)
        lead_dims, lead_shape, lead_chunks = (INIT, LEAD, MOMENT), (n_init, n_lead, k), (1, n_lead, k)
        coords = {INIT: c[INIT], LEAD: c[LEAD], MOMENT: list(MOMENTS), LAT: c[LAT], LON: c[LON]}
    else:
        sizes = [len(c[d]) for d in layout.member_dims]
        lead_dims = (INIT, LEAD, *layout.member_dims)
        lead_shape, lead_chunks = (n_init, n_lead, *sizes), (1, n_lead, 1, *sizes[1:])
        coords = dict(c)
    data = {}
    dtype = np.float64 if moments else np.float32
    for var, _, levels in layout.channel_groups():
        if levels is None:
            arr = _empty((*lead_shape, h, w), (*lead_chunks, h, w), dtype)
            data[var] = xr.DataArray(arr, dims=(*lead_dims, LAT, LON))
        else:
            arr = _empty((*lead_shape, len(levels), h, w), (*lead_chunks, len(levels), h, w), dtype)
            data[var] = xr.DataArray(arr, dims=(*lead_dims, LEVEL, LAT, LON), coords={LEVEL: levels})
        if var in layout.units:
            data[var].attrs["units"] = layout.units[var]
    return describe(xr.Dataset(data, coords=coords, attrs=layout.attrs))


def _station_template(layout: Layout, moments: bool) -> xr.Dataset:
    c, st = layout.coords(), layout.stations
    n_init, n_lead = len(layout.init_times), len(c[LEAD])
    s, v = len(st), len(layout.station_variables)
    if moments:
        dims, shape, chunks = (INIT, LEAD, MOMENT), (n_init, n_lead, len(MOMENTS)), (1, n_lead, len(MOMENTS))
        coords = {INIT: c[INIT], LEAD: c[LEAD], MOMENT: list(MOMENTS)}
    else:
        sizes = [len(c[d]) for d in layout.member_dims]
        dims, shape, chunks = (INIT, LEAD, *layout.member_dims), (n_init, n_lead, *sizes), (1, n_lead, 1, *sizes[1:])
        coords = {k: c[k] for k in (INIT, LEAD, *layout.member_dims)}
    coords.update({STATION: st["station"].to_numpy(), STATION_VARIABLE: list(layout.station_variables),
                   "station_latitude": (STATION, st["latitude"].to_numpy(np.float32)),
                   "station_longitude": (STATION, st["longitude"].to_numpy(np.float32))})
    arr = _empty((*shape, s, v), (*chunks, s, v), np.float64 if moments else np.float32)
    return xr.Dataset({STATION_FORECAST: xr.DataArray(arr, dims=(*dims, STATION, STATION_VARIABLE))},
                      coords=coords, attrs=layout.attrs)


class EnsembleStore:
    """The run's stores under `out_dir` (module docstring): create or continue, write units, finish."""

    def __init__(self, out_dir: Path, layout: Layout):
        self.out_dir, self.layout = Path(out_dir), layout
        self.moments = not layout.plan.keep_members
        field_name = "moments.zarr" if self.moments else "forecast.zarr"
        station_name = "station_moments.zarr" if self.moments else "stations.zarr"
        self.names = {"fields": field_name}
        if layout.stations is not None:
            self.names["stations"] = station_name
        self.fingerprint = layout.fingerprint()
        self.done: set[tuple[int, int]] = set()
        self.complete = False  # the final stores of this very run exist: nothing to compute
        self.groups: dict[str, Any] = {}
        self.pending: dict[int, dict[str, Any]] = {}  # moments: init -> merged so far, written when all M are in

    def final(self, kind: str) -> Path:
        return self.out_dir / self.names[kind]

    def partial(self, kind: str) -> Path:
        return self.out_dir / (self.names[kind] + ".partial")

    def _finished(self) -> bool:
        for kind in self.names:
            try:
                attrs = zarr.open_group(str(self.final(kind)), mode="r", zarr_format=2).attrs
            except (FileNotFoundError, zarr.errors.NodeNotFoundError, ValueError):
                return False
            if attrs.get(FINGERPRINT) != self.fingerprint:
                return False
        return True

    def open(self) -> set[tuple[int, int]]:
        """Create the partial stores, or continue those of an interrupted run with the same fingerprint.
        Returns the units (init index, encoder draw) already written: all of them when this run finished."""
        done_file = self.out_dir / DONE
        every = {(a, i) for a in range(len(self.layout.init_times)) for i in range(self.layout.plan.members_m)}
        if self._finished():
            self.complete = True
            done_file.unlink(missing_ok=True)  # a run stopped between its renames and this file's removal
            return every
        if done_file.is_file():
            state = json.loads(done_file.read_text())
            if state.get("fingerprint") == self.fingerprint and all(self.partial(k).is_dir() for k in self.names):
                self.done = {(int(a), int(i)) for a, i in state["done"]}
                self._open_groups()
                return set(self.done)
            raise DataError(f"{self.out_dir}: holds a partial ensemble run with other settings (fingerprint "
                            f"{state.get('fingerprint')} != {self.fingerprint}); give another out_dir")
        for kind in self.names:
            template = (_field_template if kind == "fields" else _station_template)(self.layout, self.moments)
            template.attrs[FINGERPRINT] = self.fingerprint
            template.to_zarr(self.partial(kind), mode="w", compute=False, zarr_format=2, consolidated=True)
        write_json(done_file, {"fingerprint": self.fingerprint, "done": []})
        self._open_groups()
        return set()

    def _open_groups(self) -> None:
        self.groups = {k: zarr.open_group(str(self.partial(k)), mode="r+", zarr_format=2) for k in self.names}

    def write(self, a: int, i: int, unit: dict[str, np.ndarray]) -> None:
        """Write unit (init index a, encoder draw i) by coordinate, then record it as done. Moments are merged
        in memory and an init's chunks written once all its M units are in (then all M are recorded): a
        unit is never merged twice, however a run is interrupted."""
        if self.moments:
            entry = self.pending.setdefault(a, {"n": 0})
            for kind in self.names:
                entry[kind] = _merge(entry.get(kind), unit[kind])
            entry["n"] += 1
            if entry["n"] < self.layout.plan.members_m:
                return
            del self.pending[a]
            self._write_fields(a, i, entry["fields"])
            if "stations" in self.names:
                self.groups["stations"][STATION_FORECAST][a] = entry["stations"]
            self.done |= {(a, k) for k in range(self.layout.plan.members_m)}
        else:
            self._write_fields(a, i, unit["fields"])
            if "stations" in self.names:
                self._put(self.groups["stations"][STATION_FORECAST], a, i, unit["stations"])
            self.done.add((a, i))
        write_json(self.out_dir / DONE, {"fingerprint": self.fingerprint, "done": sorted(self.done)})

    def _write_fields(self, a: int, i: int, fields: np.ndarray) -> None:
        root = self.groups["fields"]
        for var, idx, levels in self.layout.channel_groups():
            # members (lead, N, R, V, h, w) or moments (lead, moment, V, h, w): the channel axis is 3 or 2
            block = fields[:, :, idx] if self.moments else fields[:, :, :, idx]
            if levels is None:
                block = block[:, :, 0] if self.moments else block[:, :, :, 0]
            if self.moments:
                root[var][a] = block
            else:
                self._put(root[var], a, i, block)

    def _put(self, array, a: int, i: int, block: np.ndarray) -> None:
        array[a, :, i] = block if self.layout.plan.members_r > 1 else block[:, :, 0]

    def finish(self) -> dict[str, Path]:
        """Move the partial stores to their final names (an older run's are replaced), then drop the list."""
        if not self.complete:
            for kind in self.names:
                with atomic_path(self.final(kind)) as tmp:
                    self.partial(kind).rename(tmp)
        (self.out_dir / DONE).unlink(missing_ok=True)
        return {kind: self.final(kind) for kind in self.names}


def _merge(merged: np.ndarray | None, unit: np.ndarray) -> np.ndarray:
    """Chan's merge of one unit's moments (lead, moment, ...) into an init's (None = nothing yet)."""
    if merged is None:
        return unit
    dims = (LEAD, MOMENT, *[f"d{k}" for k in range(unit.ndim - 2)])
    moment = {MOMENT: list(MOMENTS)}
    out = merge_moments(xr.DataArray(merged, dims=dims, coords=moment), xr.DataArray(unit, dims=dims, coords=moment))
    return out.transpose(*dims).values
