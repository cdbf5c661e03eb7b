"""The scores of the scorecard, by registry: a new score is one entry in `METRICS`.

Each metric is an aggregate over initialisations of per-initialisation series (spatial means):

    Metric(name, inputs, aggregate, loss=..., higher_is_better=..., series={input: fn}, needs=..., label=...)

`series` are the per-init series the metric brings, each `fn(fields) -> DataArray (init_time)` of one lead
(`Fields`: the forecast, its ensemble mean, the truth, the climatology, member dims, region, skipna); `inputs`
name the series `aggregate` reduces (the last axis: initialisations); `loss` the series a paired
Diebold-Mariano test compares with a baseline's; `needs` when the metric applies (a climatology, members,
exchangeable members, a nested design). The ensemble series (fair CRPS, the variance or the nested ANOVA
components) come from `ensemble_series`, the nested design's metrics from `nested_metrics` (one per level).
`metrics_for` picks what applies to a forecast; `score_series` computes only the series those need.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import xarray as xr

from wxray.data.schema import INIT
from wxray.verify import deterministic as det
from wxray.verify import ensemble as ens
from wxray.verify.anova import SPLIT_COMPONENTS, nested_split
from wxray.verify.spatial import spatial_mean


@dataclass(frozen=True)
class Fields:
    """One channel at one lead: what a series function may read."""

    forecast: xr.DataArray  # with its member dims, if any
    mean: xr.DataArray  # the ensemble mean (the forecast itself without members)
    truth: xr.DataArray
    climatology: xr.DataArray | None
    member_dims: tuple[str, ...]
    region: object
    skipna: bool


SeriesFn = Callable[[Fields], xr.DataArray]


def _mean(x: np.ndarray) -> np.ndarray:
    return x.mean(axis=-1)


def _root_mean(x: np.ndarray) -> np.ndarray:
    return np.sqrt(x.mean(axis=-1))


@dataclass(frozen=True)
class Metric:
    name: str
    inputs: tuple[str, ...]  # per-initialisation series the aggregate is computed from
    aggregate: Callable[..., np.ndarray]  # reduces the last (initialisation) axis
    loss: str | None = None  # series a paired test compares; None: no comparison with a baseline
    higher_is_better: bool = False
    series: Mapping[str, SeriesFn] = field(default_factory=dict)  # the series this metric brings
    needs: str = ""  # "" always | "climatology" | "members" | "exchangeable" | "nested"
    label: str = ""  # plot and legend name ("" = the metric's name)
    unit_power: int = 0  # the score's units are the variable's to this power (0: dimensionless)
    plot: bool = False  # a score-vs-lead figure of its own


METRICS: tuple[Metric, ...] = (
    Metric("rmse", ("mse",), _root_mean, loss="mse", label="RMSE", unit_power=1, plot=True,
           series={"mse": lambda f: det.mse(f.mean, f.truth, f.region, f.skipna)}),
    Metric("bias", ("bias",), _mean, label="bias (forecast - truth)", unit_power=1, plot=True,
           series={"bias": lambda f: det.bias(f.mean, f.truth, f.region, f.skipna)}),
    Metric("mae", ("mae",), _mean, loss="mae", label="MAE", unit_power=1, plot=True,
           series={"mae": lambda f: det.mae(f.mean, f.truth, f.region, f.skipna)}),
    Metric("acc", ("acc",), _mean, loss="acc", higher_is_better=True, needs="climatology", label="ACC", plot=True,
           series={"acc": lambda f: det.acc(f.mean, f.truth, f.climatology, f.region, f.skipna)}),
    Metric("ssim", ("ssim",), _mean, loss="ssim", higher_is_better=True, label="SSIM", plot=True,
           series={"ssim": lambda f: det.ssim(f.mean, f.truth, f.region, f.skipna)}),
    # a deterministic forecast's CRPS is its absolute error; an ensemble's the (nested) fair CRPS (ensemble_series)
    Metric("crps", ("crps",), _mean, loss="crps", label="CRPS", unit_power=1, plot=True),
    Metric("crps_ecdf", ("crps_ecdf",), _mean, needs="members", label="CRPS (ECDF)", unit_power=1),
    Metric("spread", ("variance",), _root_mean, needs="exchangeable", label="ensemble spread", unit_power=1,
           plot=True),
)


def exchangeable_metrics(n_members: int) -> list[Metric]:
    def ssr(var, err):
        return ens.spread_skill_from_means(var.mean(-1), err.mean(-1), n_members)

    return [Metric("ssr", ("variance", "mse"), ssr, needs="exchangeable", label="spread-skill ratio")]


def nested_metrics(draws: tuple[int, ...]) -> list[Metric]:
    """A nested ensemble's metrics, from its independent draws per level, (M, M N) or (M, M N, M N R): spread
    sqrt(U_enc + U_drop [+ U_route]), the spread-skill in total and per branch, each U, the shares rho."""
    parts = SPLIT_COMPONENTS[: len(draws)]

    def branch(key):
        def f(*a):
            return ens.branch_spread_skill([u.mean(-1) for u in a[:-1]], a[-1].mean(-1), draws)[key]
        return f

    def share(k):
        def f(*us):
            with np.errstate(divide="ignore", invalid="ignore"):
                return us[k].mean(-1) / sum(u.mean(-1) for u in us)
        return f

    names = {"enc": "encoder", "drop": "dropout", "route": "routing"}
    out = [Metric("spread", parts, lambda *us: np.sqrt(sum(us).mean(-1)), needs="nested", label="ensemble spread",
                  unit_power=1, plot=True),
           Metric("ssr", (*parts, "mse"), branch("ssr_total"), needs="nested", label="spread-skill ratio")]
    out += [Metric(u, (u,), _mean, needs="nested", label=f"U_{u[2:]}", unit_power=2) for u in parts]
    out += [Metric(f"rho_{u[2:]}", parts, share(k), needs="nested", label=f"{names[u[2:]]} share of variance",
                   plot=True) for k, u in enumerate(parts) if k]
    out += [Metric(f"ssr_{u[2:]}", (*parts, "mse"), branch(f"ssr_{u[2:]}"), needs="nested") for u in parts]
    out.append(Metric("ssr_total", (*parts, "mse"), branch("ssr_total"), needs="nested"))
    return out


def nested_draws(sizes: Mapping[str, int], member_dims: Sequence[str]) -> tuple[int, ...] | None:
    """Independent draws per nested level: (M, M N), or (M, M N, M N R) with a routing level; None when the
    member dims are not nested."""
    if not {ens.ENCODER_DRAW, ens.DROPOUT_DRAW} <= set(member_dims):
        return None
    m, n = sizes[ens.ENCODER_DRAW], sizes[ens.DROPOUT_DRAW]
    return (m, m * n, m * n * sizes[ens.ROUTING_DRAW]) if ens.ROUTING_DRAW in member_dims else (m, m * n)


def metrics_for(n_members: int, nested: tuple[int, ...] | None, has_climatology: bool,
                names: Sequence[str] | None = None) -> list[Metric]:
    """The metrics that apply to a forecast with K members (K = 1: deterministic); `nested`: the independent
    draws of a nested ensemble's levels, (M, M N) or (M, M N, M N R). `names`: only these (None: all)."""
    have = {""} | ({"climatology"} if has_climatology else set()) | ({"members"} if n_members >= 2 else set())
    if nested:
        have.add("nested")
    elif n_members >= 2:
        have.add("exchangeable")
    pool = list(METRICS)
    if nested:
        pool = [m for m in pool if m.name != "spread"] + nested_metrics(nested)
    elif n_members >= 2:
        pool += exchangeable_metrics(n_members)
    out = [m for m in pool if m.needs in have]
    return out if names is None else [m for m in out if m.name in names]


def ensemble_series(f: Fields, wanted: set[str], maps: bool = True
                    ) -> tuple[dict[str, xr.DataArray], dict, xr.DataArray | None]:
    """The ensemble's own series among `wanted` (crps, crps_ecdf, variance, U_*); with `maps` also its time-mean
    CRPS and spread maps and its rank histogram (None without members)."""
    s, out_maps, hist = {}, {}, None
    if not f.member_dims:
        if "crps" in wanted or maps:
            field_ = abs(f.mean - f.truth)  # a deterministic forecast's CRPS: its absolute error
            s["crps"] = spatial_mean(field_, f.region, f.skipna)
            if maps:
                out_maps["mae_map"] = field_.mean(INIT, skipna=f.skipna)
        return s, out_maps, None
    if not maps and not wanted & {"crps", "crps_ecdf", "variance", *SPLIT_COMPONENTS}:
        return s, out_maps, None
    flat = ens.flatten_members(f.forecast, f.member_dims) if len(f.member_dims) > 1 else f.forecast
    dim = ens.MEMBER if len(f.member_dims) > 1 else f.member_dims[0]
    is_nested = set(f.member_dims) >= {ens.ENCODER_DRAW, ens.DROPOUT_DRAW}
    field_ = (ens.crps_field_nested(f.forecast, f.truth, skipna=f.skipna) if is_nested
              else ens.crps_field(flat, f.truth, dim, fair=True, skipna=f.skipna))
    s["crps"] = spatial_mean(field_, f.region, f.skipna)
    if "crps_ecdf" in wanted:
        s["crps_ecdf"] = ens.crps_ecdf(flat, f.truth, dim, f.region, f.skipna)
    if is_nested:
        parts = nested_split(f.forecast)
        names = [u for u in SPLIT_COMPONENTS if u in parts]
        for u in names:
            s[u] = spatial_mean(parts[u], f.region, f.skipna)
        var = sum(parts[u] for u in names)  # a new member's variance, unbiased (not the pooled one)
    else:
        var = ens.ensemble_variance(flat, dim)
        s["variance"] = spatial_mean(var, f.region, f.skipna)
    if maps:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # scores warns on NaN members, already accounted for by skipna
            hist = ens.rank_histogram(flat, f.truth, dim, region=f.region)
        out_maps["spread_map"] = np.sqrt(var.mean(INIT, skipna=f.skipna))
        out_maps["crps_map"] = field_.mean(INIT, skipna=f.skipna)
    return s, out_maps, hist


def score_series(forecast: xr.DataArray, truth: xr.DataArray, climatology: xr.DataArray | None,
                 member_dims: tuple[str, ...], region, skipna: bool, metrics: Sequence[Metric] | None = None,
                 maps: bool = True):
    """Per-initialisation series of one lead for `metrics` (default: all that apply); with `maps` the time-mean
    maps and the rank histogram."""
    mean = ens.ensemble_mean(forecast, member_dims) if member_dims else forecast
    f = Fields(forecast, mean, truth, climatology, tuple(member_dims), region, skipna)
    if metrics is None:
        metrics = metrics_for(ens.ensemble_size(forecast, member_dims) if member_dims else 1,
                              nested_draws(forecast.sizes, member_dims), climatology is not None)
    wanted = {i for m in metrics for i in m.inputs}
    s = {k: fn(f) for m in metrics for k, fn in m.series.items() if k in wanted}
    more, out_maps, hist = ensemble_series(f, wanted, maps)
    s.update(more)
    series = {k: np.asarray(v.transpose(INIT).values, dtype=np.float64) for k, v in s.items()}
    return series, out_maps, hist
