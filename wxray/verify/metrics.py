"""The scores of the scorecard, by registry: a new score is one class (`metric_base.Metric`) and one line in `METRICS`.

Every caller picks its scores from `METRICS` by what the classes say of themselves (`metric_base`): the
scorecard (`metrics_for`: what applies to a forecast's design), the plots (`plot`, `key_comparison`), RESULT's
headline and the console digest (`headline`, `key_comparison`, `digest`), a rollout's per-lead report
(`rollout`), an inference sweep's trial report (`sweep`, `calibration`); training validation reports RMSE
under its name, aggregated by its `from_means`. Deterministic scores are of the ensemble mean (the forecast
itself without members), latitude-weighted spatial means per initialisation (`verify.deterministic`):

    rmse   sqrt(mean over inits of the MSE)          bias   mean of forecast - truth
    mae    mean of |forecast - truth|                 ssim   mean SSIM
    acc    mean uncentred anomaly correlation against the climatology (only with one)

The ensemble's scores are in `ensemble_metrics`. `score_series` computes one lead's series of the chosen
metrics, each shared series once (RMSE's and the spread-skill's MSE, spread's and SSR's variance, the CRPS
forms' sort of the members), and the time-mean maps.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import xarray as xr

from wxray.verify import deterministic as det
from wxray.verify import ensemble as ens
from wxray.verify.ensemble_metrics import (
    CRPS,
    BranchSpreadSkill,
    Component,
    CRPSEcdf,
    NestedSpread,
    NestedSpreadSkill,
    Share,
    Spread,
    SpreadSkill,
    TotalSpreadSkill,
    lead_maps,
)
from wxray.verify.metric_base import Design, Fields, MeanScore, Metric, mean_squared_error, per_init, series_of


class RMSE(Metric):
    name = "rmse"
    label = "RMSE"
    inputs = ("mse",)
    loss = "mse"
    unit_power = 1
    plot = True
    headline = 1
    key_comparison = True
    digest = 1
    sweep = 2
    rollout = True

    def series(self, f: Fields) -> dict[str, xr.DataArray]:
        return {"mse": f.once(mean_squared_error)}

    def from_means(self, mse: np.ndarray) -> np.ndarray:
        return np.sqrt(mse)


class Bias(MeanScore):
    name = "bias"
    label = "bias (forecast - truth)"
    inputs = ("bias",)
    unit_power = 1
    plot = True
    zero_line = 0.0

    def series(self, f: Fields) -> dict[str, xr.DataArray]:
        return {"bias": det.bias(f.mean, f.truth, f.region, f.skipna)}


class MAE(MeanScore):
    name = "mae"
    label = "MAE"
    inputs = ("mae",)
    loss = "mae"
    unit_power = 1
    plot = True

    def series(self, f: Fields) -> dict[str, xr.DataArray]:
        return {"mae": det.mae(f.mean, f.truth, f.region, f.skipna)}


class ACC(MeanScore):
    """Needs a climatology (the truth's `stats/climatology` at the valid times)."""

    name = "acc"
    label = "ACC"
    inputs = ("acc",)
    loss = "acc"
    higher_is_better = True
    plot = True
    headline = 4
    rollout = True
    banded = False  # a ratio of spatial means: scored on the whole ensemble-mean field

    def applies(self, design: Design) -> bool:
        return design.climatology

    def series(self, f: Fields) -> dict[str, xr.DataArray]:
        return {"acc": det.acc(f.mean, f.truth, f.climatology, f.region, f.skipna)}


class SSIM(MeanScore):
    name = "ssim"
    label = "SSIM"
    inputs = ("ssim",)
    loss = "ssim"
    higher_is_better = True
    plot = True
    banded = False  # a Gaussian window across rows and the field's own range: whole fields only

    def series(self, f: Fields) -> dict[str, xr.DataArray]:
        return {"ssim": det.ssim(f.mean, f.truth, f.region, f.skipna)}


# The scorecard's order. Exchangeable and nested ensembles have a spread and an ssr of their own (one applies).
METRICS: tuple[Metric, ...] = (
    RMSE(), Bias(), MAE(), ACC(), SSIM(), CRPS(), CRPSEcdf(),
    Spread(), NestedSpread(), SpreadSkill(), NestedSpreadSkill(),
    *(Component(level=i) for i in range(3)), *(Share(level=i) for i in (1, 2)),
    *(BranchSpreadSkill(level=i) for i in range(3)), TotalSpreadSkill(),
)


def by_name() -> dict[str, Metric]:
    """Every registered score by name, unbound (the first of a name: labels, units and roles are shared)."""
    out: dict[str, Metric] = {}
    for m in METRICS:
        out.setdefault(m.name, m)
    return out


def label(name: str) -> str:
    """The plots' name of a score (its name where it has no label or is not registered)."""
    m = by_name().get(name)
    return (m.label or m.name) if m is not None else name


def headline_names() -> list[str]:
    """RESULT's headline scores, in their order (`Metric.headline`)."""
    return [m.name for m in sorted((m for m in by_name().values() if m.headline), key=lambda m: m.headline)]


def key_comparisons() -> list[str]:
    """A comparison's main scores (`Metric.key_comparison`), in the registry's order."""
    return [m.name for m in by_name().values() if m.key_comparison]


def nested_draws(sizes: Mapping[str, int], member_dims: Sequence[str]) -> tuple[int, ...] | None:
    """Independent draws per nested level: (M, M N), or (M, M N, M N R) with a routing level; None when the
    member dims are not nested."""
    if not {ens.ENCODER_DRAW, ens.DROPOUT_DRAW} <= set(member_dims):
        return None
    m = sizes[ens.ENCODER_DRAW]
    n = sizes[ens.DROPOUT_DRAW]
    return (m, m * n, m * n * sizes[ens.ROUTING_DRAW]) if ens.ROUTING_DRAW in member_dims else (m, m * n)


def metrics_for(n_members: int, nested: tuple[int, ...] | None, has_climatology: bool,
                names: Sequence[str] | None = None) -> list[Metric]:
    """The metrics that apply to a forecast with K members (K = 1: deterministic), bound to it; `nested`: the
    independent draws of a nested ensemble's levels, (M, M N) or (M, M N, M N R). `names`: only these."""
    design = Design(n_members, nested, has_climatology)
    return [m.bind(design) for m in METRICS if m.applies(design) and (names is None or m.name in names)]


def score_series(forecast: xr.DataArray, truth: xr.DataArray, climatology: xr.DataArray | None,
                 member_dims: tuple[str, ...], region, skipna: bool, metrics: Sequence[Metric] | None = None,
                 maps: bool = True):
    """Per-initialisation series of one lead for `metrics` (default: all that apply), {input: float64 array};
    with `maps` the time-mean maps and the rank histogram (`ensemble_metrics.lead_maps`)."""
    f = Fields(forecast, truth, climatology, tuple(member_dims), region, skipna)
    if metrics is None:
        metrics = metrics_for(ens.ensemble_size(forecast, member_dims) if member_dims else 1,
                              nested_draws(forecast.sizes, member_dims), climatology is not None)
    series = per_init(series_of(f, metrics))
    out_maps, hist = lead_maps(f) if maps else ({}, None)
    return series, out_maps, hist
