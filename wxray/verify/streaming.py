"""Streamed scoring of one channel at one lead: block by block of inits (`verify.blocks`), each read with all its
members, and reduced to what the scorecard needs, which is small.

    score_block(BlockTask) -> BlockResult     one block: per-init series of every model, per-point sums of the
                                              time-mean maps (`sums.TimeSum`), rank counts, non-finite count
    LeadSums.add(result) ...; .series()        the blocks of one lead, in init order: the whole per-init series

The series of a block of inits are the same numbers as those of all inits at once (every series is per init).
A block in latitude bands (`BlockPlan.banded`) scores each band as a region of the whole grid
(`spatial.Band`: weighted sums and weights, added over the bands, then divided: `spatial.from_parts`): every
`Metric.banded` score is a spatial mean of pointwise values (RMSE's squared errors, bias, MAE, CRPS, the
variance, the ANOVA components), and the maps and rank counts are pointwise. ACC (a ratio of three spatial
means) and SSIM (a window across rows, the field's own range) are not: they are scored after the bands, on the
ensemble mean assembled band by band (no members: one field per init), the truth and the climatology.

`score_block` reads its inputs itself (lazy selections in, float64 out), so a block map can run it anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import xarray as xr

from wxray.data.schema import INIT, LAT, LON
from wxray.verify.blocks import bands
from wxray.verify.ensemble_metrics import lead_sums
from wxray.verify.metric_base import Fields, Metric, per_init, series_of
from wxray.verify.spatial import PART, PARTS, Band, from_parts
from wxray.verify.sums import TimeSum


@dataclass
class BlockTask:
    """One block: the lazy fields of each model (forecast first) at the block's inits, the truth and the
    climatology there, and how to score them. `rows`: latitude rows per band (>= nlat: the whole grid)."""

    fields: list[xr.DataArray]
    truth: xr.DataArray
    climatology: xr.DataArray | None
    member_dims: list[tuple[str, ...]]
    metric_sets: list[list[Metric]]
    region: object
    skipna: bool
    maps: bool
    rows: int


@dataclass
class BlockResult:
    """Per model {series input: per-init values}, the forecast's map sums and rank counts, non-finite values."""

    series: list[dict[str, np.ndarray]]
    sums: dict[str, TimeSum]
    counts: np.ndarray | None
    nans: int


def _load(da: xr.DataArray) -> xr.DataArray:
    """float64 in memory, an infinite value as NaN: an inf is no forecast (a blown-up model), never a score."""
    values = np.array(da.values, dtype=np.float64)  # our own copy (of a lazy selection or a view): set in place
    values[~np.isfinite(values)] = np.nan
    return da.copy(data=values)


def _climatology(da: xr.DataArray | None) -> xr.DataArray | None:
    return da.load().astype(np.float64) if da is not None else None  # as stored: never counted or masked


def _nans(a: xr.DataArray) -> int:
    return int(a.isnull().sum())


def score_block(task: BlockTask) -> BlockResult:
    """Score one block (the whole grid, or band by band): see the module docstring."""
    if task.rows >= task.truth.sizes[LAT]:
        return _whole(task)
    return _banded(task)


def _whole(task: BlockTask) -> BlockResult:
    truth = _load(task.truth)
    clim = _climatology(task.climatology)
    nans, series, sums, counts = _nans(truth), [], {}, None
    for i, (lazy, dims, metrics) in enumerate(zip(task.fields, task.member_dims, task.metric_sets, strict=True)):
        forecast = _load(lazy)  # one model at a time: the larger one's members are the block's size
        nans += _nans(forecast)
        f = Fields(forecast, truth, clim, dims, task.region, task.skipna)
        series.append(per_init(series_of(f, metrics)))
        if i == 0 and task.maps:
            sums, counts = lead_sums(f)
    return BlockResult(series, sums, counts, nans)


@dataclass
class _Bands:
    """What the bands of a block add up: per model the parts of its banded series and its ensemble-mean bands."""

    parts: list[dict[str, np.ndarray]]
    means: list[list[xr.DataArray]]
    sums: dict[str, TimeSum] = field(default_factory=dict)
    counts: np.ndarray | None = None
    nans: int = 0


def _banded(task: BlockTask) -> BlockResult:
    lat, lon = task.truth[LAT], task.truth[LON]
    n = len(task.fields)
    acc = _Bands([{} for _ in range(n)], [[] for _ in range(n)])
    for rows in bands(lat.size, task.rows):
        _score_band(task, rows, Band.of(lat, lon, task.region, rows), acc)
    series = [{k: np.asarray(from_parts(xr.DataArray(v, dims=(PART, INIT), coords={PART: list(PARTS)})))
               for k, v in parts.items()} for parts in acc.parts]
    whole = [[m for m in ms if not m.banded] for ms in task.metric_sets]
    if any(whole):  # ACC, SSIM: the whole ensemble-mean field (no members), truth and climatology
        truth, clim = _load(task.truth), _climatology(task.climatology)
        for i, metrics in enumerate(whole):
            if metrics:
                mean = xr.concat(acc.means[i], dim=LAT)
                series[i].update(per_init(series_of(Fields(mean, truth, clim, (), task.region, task.skipna), metrics)))
    return BlockResult(series, acc.sums, acc.counts, acc.nans)


def _score_band(task: BlockTask, rows: slice, band: Band, acc: _Bands) -> None:
    truth = _load(task.truth.isel({LAT: rows}))
    clim = _climatology(task.climatology.isel({LAT: rows}) if task.climatology is not None else None)
    acc.nans += _nans(truth)
    for i, (lazy, dims, metrics) in enumerate(zip(task.fields, task.member_dims, task.metric_sets, strict=True)):
        forecast = _load(lazy.isel({LAT: rows}))
        acc.nans += _nans(forecast)
        f = Fields(forecast, truth, clim, dims, band, task.skipna)
        for k, v in series_of(f, [m for m in metrics if m.banded]).items():
            part = v.transpose(PART, INIT).values
            acc.parts[i][k] = acc.parts[i][k] + part if k in acc.parts[i] else part
        if not all(m.banded for m in metrics):
            acc.means[i].append(f.mean.transpose(INIT, LAT, LON))
        if i == 0 and task.maps:
            sums, counts = lead_sums(f)
            for k, s in sums.items():
                acc.sums.setdefault(k, TimeSum.zeros((task.truth.sizes[LAT], task.truth.sizes[LON]))).place(s, rows)
            acc.counts = counts if acc.counts is None else acc.counts + counts


class LeadSums:
    """The blocks of one channel at one lead, added in init order."""

    def __init__(self, n_models: int):
        self.parts: list[dict[str, list[np.ndarray]]] = [{} for _ in range(n_models)]
        self.sums: dict[str, TimeSum] = {}
        self.counts: np.ndarray | None = None
        self.nans = 0

    def add(self, r: BlockResult) -> None:
        for acc, s in zip(self.parts, r.series, strict=True):
            for k, v in s.items():
                acc.setdefault(k, []).append(v)
        for k, s in r.sums.items():
            self.sums[k] = self.sums[k] + s if k in self.sums else s
        if r.counts is not None:
            self.counts = r.counts if self.counts is None else self.counts + r.counts
        self.nans += r.nans

    def series(self) -> list[dict[str, np.ndarray]]:
        """Per model {input: values over every init}, in init order."""
        return [{k: np.concatenate(v) for k, v in acc.items()} for acc in self.parts]
