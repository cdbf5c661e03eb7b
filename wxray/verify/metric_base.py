"""A score as a class (WeatherBench 2's `metrics.py` pattern): its per-initialisation series and their aggregate.

    series(fields) -> {input: DataArray (init_time)}   one lead's spatial means, one value per initialisation
    aggregate(*inputs) -> array                         the score over initialisations (reduces the last axis,
                                                        so a leading axis of resamples is scored at once)
                      = from_means(*(x.mean(-1) for x in inputs))   for every score built from the inputs' means

`from_means` is what a streamed accumulation needs (training validation sums per-window MSE across workers: its
RMSE is `from_means(sum / count)`). What a class knows about itself, read by every caller that picks scores:

    name, label, unit_power     the scorecard's name, the plots' name, the score's units as the variable's power
    higher_is_better, loss      the direction; the series a paired Diebold-Mariano test compares (None: no test)
    plot                        a score-vs-lead figure of its own
    headline                    its place among RESULT's headline scores at the first and last lead (0: not there)
    key_comparison              a comparison's main score: a WeatherBench 2 heatmap and its mean rel_diff in RESULT
    digest                      the console digest shows the score of highest rank (0: never)
    one_member_alias            the score it equals for a one-member forecast (CRPS: "mae"): no heatmap or digest
                                of it there, and its label says so
    zero_line                   a line at this value on its score-vs-lead plot (None: none)
    sweep                       its place in an inference sweep trial's report of means over leads per channel
                                (0: not there)
    calibration                 the value of a calibrated forecast: a sweep's trial reports `<name>_distance`
                                (mean |score - value|) and `mean_<name>`
    rollout                     a rollout's per-lead report carries it beside persistence's
    banded                      every input series is `f.spatial` (or `verify.deterministic`'s mse, bias, mae)
                                of a pointwise field, so a latitude band of the grid scores its part of it
                                (`spatial.Band`); False (ACC: a ratio of means, SSIM: a filter across rows):
                                scored on whole fields of the ensemble mean (`verify.streaming`)

`applies(design)` says whether it scores a forecast of that `Design` (members, nested draws, a climatology);
`bind(design)` is the instance that does (a spread-skill ratio needs K). `Fields` is one channel at one lead;
what several scores share of it (the ensemble mean's MSE, the members' sort, the ANOVA split) is computed once
per lead through `Fields.once`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import numpy as np
import xarray as xr

from wxray.data.schema import INIT
from wxray.verify import deterministic as det
from wxray.verify import ensemble as ens
from wxray.verify.spatial import spatial_mean

T = TypeVar("T")


@dataclass(frozen=True)
class Design:
    """What a forecast offers the scores: K members (1: deterministic), a nested ensemble's independent draws
    per level (M, M N) or (M, M N, M N R) (None: not nested), and whether a climatology is at hand."""

    members: int = 1
    draws: tuple[int, ...] | None = None
    climatology: bool = False

    @property
    def ensemble(self) -> bool:
        return self.members >= 2

    @property
    def nested(self) -> bool:
        return bool(self.draws)


@dataclass(eq=False)
class Fields:
    """One channel at one lead: the forecast (with its member dims, if any), the truth, the climatology at the
    valid times; and, through `once`, what several scores share of them."""

    forecast: xr.DataArray
    truth: xr.DataArray
    climatology: xr.DataArray | None
    member_dims: tuple[str, ...]
    region: object
    skipna: bool
    _shared: dict[Callable, Any] = field(default_factory=dict, init=False, repr=False)

    def once(self, fn: Callable[[Fields], T]) -> T:
        """fn(self), computed at most once per lead (keyed by the function)."""
        if fn not in self._shared:
            self._shared[fn] = fn(self)
        return self._shared[fn]

    @property
    def mean(self) -> xr.DataArray:
        """The ensemble mean (the forecast itself without members)."""
        return self.once(_ensemble_mean)

    def spatial(self, values: xr.DataArray) -> xr.DataArray:
        """The per-initialisation spatial mean of a field (latitude-weighted, over the region)."""
        return spatial_mean(values, self.region, self.skipna)


def _ensemble_mean(f: Fields) -> xr.DataArray:
    return ens.ensemble_mean(f.forecast, f.member_dims) if f.member_dims else f.forecast


def mean_squared_error(f: Fields) -> xr.DataArray:
    """The ensemble mean's per-init spatial MSE: RMSE's series, and the skill of every spread-skill ratio."""
    return det.mse(f.mean, f.truth, f.region, f.skipna)


@dataclass(frozen=True, kw_only=True)
class Metric(ABC):
    """A score of the scorecard; the module docstring lists what a subclass sets."""

    name: ClassVar[str]
    inputs: ClassVar[tuple[str, ...]]  # the per-initialisation series `aggregate` reduces, in its argument order
    label: ClassVar[str] = ""  # "": the name
    unit_power: ClassVar[int] = 0
    higher_is_better: ClassVar[bool] = False
    loss: ClassVar[str | None] = None
    plot: ClassVar[bool] = False
    headline: ClassVar[int] = 0
    key_comparison: ClassVar[bool] = False
    digest: ClassVar[int] = 0
    one_member_alias: ClassVar[str] = ""
    zero_line: ClassVar[float | None] = None
    sweep: ClassVar[int] = 0
    calibration: ClassVar[float | None] = None
    rollout: ClassVar[bool] = False
    banded: ClassVar[bool] = True

    def applies(self, design: Design) -> bool:
        return True

    def bind(self, design: Design) -> Metric:
        return self

    @abstractmethod
    def series(self, f: Fields) -> dict[str, xr.DataArray]:
        """Every input series of one lead, {name: DataArray (init_time)}."""

    @abstractmethod
    def from_means(self, *means: np.ndarray) -> np.ndarray:
        """The score from each input's mean over initialisations."""

    def aggregate(self, *inputs: np.ndarray) -> np.ndarray:
        return self.from_means(*(x.mean(axis=-1) for x in inputs))


class MeanScore(Metric):
    """A score that is the mean over initialisations of its one series (bias, MAE, ACC, CRPS, ...)."""

    def from_means(self, *means: np.ndarray) -> np.ndarray:
        return means[0]


def series_of(f: Fields, metrics: list[Metric]) -> dict[str, xr.DataArray]:
    """Every series input of `metrics` on these fields, {input: per-init values} (xarray)."""
    out: dict[str, xr.DataArray] = {}
    for m in metrics:
        out.update(m.series(f))
    return out


def per_init(series: dict[str, xr.DataArray]) -> dict[str, np.ndarray]:
    """The series as float64 arrays in init order."""
    return {k: np.asarray(v.transpose(INIT).values, dtype=np.float64) for k, v in series.items()}
