"""The scorecard: every applicable score per channel x lead, with intervals and paired tests.

Layout (an xarray Dataset, written as netCDF; `scorecard_table` gives the same as a long CSV table):

* dims `channel` (e.g. "geopotential_500"; coords `variable`, `level`, `units`: the variable's `units`
  attribute from the truth, else the forecast, "" if neither has one; `level` -1 for a surface field),
  `lead_time` (timedelta), `metric` (coords `higher_is_better`, `unit_power`: the score's units are the
  variable's to this power, 0 for ACC, SSIM and ratios), and where they apply `rank` (1..K+1) and
  `latitude` x `longitude`;
* `value`, `ci_lower`, `ci_upper` (channel, lead_time, metric): the aggregate over initialisations and its
  interval (`wxray.verify.inference`). Default method "fixed-b": a t interval whose variance is a
  prewhitened Bartlett HAC estimate with fixed-b critical values (nonlinear aggregates such as RMSE
  linearised by the jackknife). Method "paper": the percentile interval of a circular moving-block
  bootstrap with the Wilks (1997) block length, the same resamples for every series (paired);
* `n_init`, `block_length` (channel, lead_time): series length and lag window: the Bartlett bandwidth
  M = ceil(2 sqrt n) (fixed-b) or the largest Wilks block length of the series (paper);
* `has_intervals` (channel, lead_time): 1 where the series is long enough for the method's intervals and
  tests, 0 where it is not (fewer than 6 inits for fixed-b, max(4, 2L) for the bootstrap): there the scores
  are the point estimates alone, every interval, DM test and `significant` NaN (block_length 0), and attr
  `intervals` says so ("none" or "partial"; "all" otherwise);
* with a baseline: `baseline_value`, `baseline_ci_lower/upper`, `rel_diff` = value / baseline - 1
  (`REL_DIFF_CONVENTION`: negative is better for rmse/mae/crps, positive for acc/ssim) with
  `rel_ci_lower/upper`, and the Diebold-Mariano test of the per-initialisation loss differential
  `dm_statistic`, `dm_p_value` (negative statistic: the forecast has the lower loss), `significant`
  (1/0 at level `significance`; NaN: not compared);
* `rank_histogram` (channel, lead_time, rank); time-mean maps `crps_map` and `spread_map` of an ensemble,
  `mae_map` of a one-member forecast (its CRPS is its absolute error, so the map is the MAE);
* `nan_points` (channel): points skipped with skipna (NaN or infinite: an inf counts as missing).

attrs: `forecast`, `baseline` (names), `significance_method` (of the intervals and tests), `rel_diff_convention`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import xarray as xr
from tqdm.auto import tqdm

from wxray.data.schema import INIT, LAT, LEAD, LON, Channel, select_channel
from wxray.errors import DataError
from wxray.verify import deterministic as det
from wxray.verify import ensemble as ens
from wxray.verify.forecasts import truth_at
from wxray.verify.inference import (
    DEFAULT_METHOD,
    block_bootstrap,
    check_method,
    check_series_length,
    circular_block_indices,
    correlation_length,
    diebold_mariano,
    hac_bandwidth,
    hac_interval,
    min_series_length,
)
from wxray.verify.metrics import Metric, metrics_for, nested_draws, score_series

REL_DIFF_CONVENTION = "forecast / baseline - 1; negative is better for rmse/mae/crps, positive for acc/ssim"


NO_INTERVALS = "no intervals"  # `_ci`'s index argument where the series is too short for the method's intervals


def _ci(arrays: list[np.ndarray], statistic, idx, confidence: float) -> tuple[float, float, float]:
    # idx: the paper's shared bootstrap indices; None: the fixed-b interval (paired through the jackknife);
    # NO_INTERVALS: the estimate alone
    if isinstance(idx, str):
        with np.errstate(divide="ignore", invalid="ignore"):
            return float(np.asarray(statistic(*arrays))), np.nan, np.nan
    ci = (hac_interval(arrays, statistic, confidence=confidence) if idx is None
          else block_bootstrap(arrays, statistic, confidence=confidence, indices=idx))
    return float(ci.estimate), float(ci.lower), float(ci.upper)


def _interval(series: dict[str, np.ndarray], metric: Metric, idx, confidence: float):
    arrays = [series[k] for k in metric.inputs]
    if not all(np.isfinite(a).all() for a in arrays):
        return np.nan, np.nan, np.nan
    return _ci(arrays, metric.aggregate, idx, confidence)


def _relative(sf: dict, sb: dict, metric: Metric, idx, confidence: float):
    k = len(metric.inputs)
    arrays = [sf[i] for i in metric.inputs] + [sb[i] for i in metric.inputs]
    if not all(np.isfinite(a).all() for a in arrays):
        return np.nan, np.nan, np.nan

    def rel(*a):
        with np.errstate(divide="ignore", invalid="ignore"):
            return metric.aggregate(*a[:k]) / metric.aggregate(*a[k:]) - 1

    return _ci(arrays, rel, idx, confidence)


@dataclass
class Model:
    """One forecast to score: its dataset (forecast convention, on the truth grid) and member layout."""

    name: str
    data: xr.Dataset

    @property
    def member_dims(self) -> tuple[str, ...]:
        return ens.member_dims_of(self.data)

    def n_members(self) -> int:
        return ens.ensemble_size(self.data, self.member_dims) if self.member_dims else 1

    def nested_draws(self) -> tuple[int, ...] | None:
        """Independent draws per nested level: (M, M N), or (M, M N, M N R) with a routing level."""
        return nested_draws(self.data.sizes, self.member_dims)

    def check_members(self) -> None:
        if ens.MEMBER in self.member_dims and len(self.member_dims) > 1:
            raise DataError(f"{self.name}: has both '{ens.MEMBER}' and nested member dims "
                            f"{list(self.member_dims[1:])}; use one layout")
        for d in self.member_dims:
            if self.data.sizes[d] < 2:
                kind = {ens.ENCODER_DRAW: "groups for the ANOVA split", ens.DROPOUT_DRAW:
                        "replicates for the ANOVA split"}.get(d, "members for ensemble scores")
                raise DataError(f"{self.name}: member dim '{d}' has {self.data.sizes[d]} entries; need at "
                                f"least 2 {kind} (drop the dim to score a deterministic forecast)")


def _finite(a: xr.DataArray) -> xr.DataArray:
    """Infinite values as NaN: an inf is no forecast (a blown-up model, a bad fill value), never a score."""
    return a.where(np.isfinite(a))


def _nan_count(*arrays: xr.DataArray) -> int:
    return int(sum(int(a.isnull().sum()) for a in arrays))


BASELINE_FIELDS = ("baseline_value", "baseline_ci_lower", "baseline_ci_upper", "rel_diff", "rel_ci_lower",
                   "rel_ci_upper", "dm_statistic", "dm_p_value", "significant")


@dataclass
class _Settings:
    region: object
    skipna: bool
    n_bootstrap: int
    confidence: float
    significance: float
    method: str = DEFAULT_METHOD
    intervals: bool = True
    maps: bool = True


def _score_lead(models: list[Model], metric_sets: list[list[Metric]], fields: list[xr.DataArray],
                truth: xr.DataArray, clim: xr.DataArray | None, what: str, cfg: _Settings,
                rng: np.random.Generator) -> tuple[dict[str, np.ndarray], dict, object, int, int]:
    """All metrics of one channel at one lead: {field: values per metric}, maps, histogram, n, ell."""
    results = [score_series(f, truth, clim, m.member_dims, cfg.region, cfg.skipna, ms, maps=cfg.maps)
               for f, m, ms in zip(fields, models, metric_sets)]
    series = [r[0] for r in results]
    if cfg.skipna:  # an initialisation with no valid point at all drops out of every series (paired)
        keep = np.logical_and.reduce([np.isfinite(v) for s in series for v in s.values()])
        series = [{k: v[keep] for k, v in s.items()} for s in series]
    n = len(next(iter(series[0].values())))
    if n == 0:
        check_series_length(n, None, what)  # nothing to score at all: an error, not a scorecard of NaN
    if cfg.method == "paper":  # one Wilks length and one set of bootstrap indices for every series (paired)
        lengths = [int(correlation_length(v)) for s in series for v in s.values() if np.isfinite(v).all()]
        ell = max(lengths, default=1)
        idx = circular_block_indices(n, ell, cfg.n_bootstrap, rng) if n >= min_series_length(ell) else None
    else:  # fixed-b: ell is the Bartlett bandwidth M, the same for every series of this length
        ell, idx = (hac_bandwidth(n), None) if n >= min_series_length(None) else (0, None)
    if not cfg.intervals or n < min_series_length(ell if cfg.method == "paper" else None):
        ell, idx = 0, NO_INTERVALS  # scores, but no intervals or tests
    names = [m.name for m in metric_sets[0]]
    row = {k: np.full(len(names), np.nan) for k in ("value", "ci_lower", "ci_upper")}
    if len(models) > 1:
        row.update({k: np.full(len(names), np.nan) for k in BASELINE_FIELDS})
    by_name = [{m.name: m for m in ms} for ms in metric_sets]
    for i, name in enumerate(names):
        metric = by_name[0][name]
        v = _interval(series[0], metric, idx, cfg.confidence)
        row["value"][i], row["ci_lower"][i], row["ci_upper"][i] = v
        if len(models) == 1 or metric.loss is None or name not in by_name[1]:
            continue
        b = _interval(series[1], by_name[1][name], idx, cfg.confidence)
        row["baseline_value"][i], row["baseline_ci_lower"][i], row["baseline_ci_upper"][i] = b
        r = _relative(series[0], series[1], metric, idx, cfg.confidence)
        row["rel_diff"][i], row["rel_ci_lower"][i], row["rel_ci_upper"][i] = r
        loss_f, loss_b = series[0][metric.loss], series[1][metric.loss]
        if ell and np.isfinite(loss_f).all() and np.isfinite(loss_b).all():
            dm = diebold_mariano(loss_f, loss_b, lag=ell if cfg.method == "paper" else ell - 1, method=cfg.method)
            row["dm_statistic"][i], row["dm_p_value"][i] = float(dm.statistic), float(dm.p_value)
            row["significant"][i] = float(np.nan_to_num(dm.p_value, nan=1.0) < cfg.significance)
    return row, results[0][1], results[0][2], n, ell


def build_scorecard(forecast: Model, truth: xr.Dataset, channels: list[Channel], *,
                    climatology: xr.Dataset | None = None, baseline: Model | None = None,
                    region=None, skipna: bool = False, n_bootstrap: int = 5000, confidence: float = 0.95,
                    significance: float = 0.05, seed: int = 0, method: str = DEFAULT_METHOD,
                    metrics: Sequence[str] | None = None, intervals: bool = True, maps: bool = True,
                    progress: bool = False) -> xr.Dataset:
    """Score `forecast` (and compare with `baseline`) on every channel x lead; see the module doc.

    `method`: "fixed-b" (default) or "paper", see `wxray.verify.inference`; n_bootstrap and seed apply to "paper".
    `metrics`: only these of `verify.metrics.METRICS` (default: every one that applies); `intervals=False`: the
    scores alone (no intervals or tests, as with too few inits); `maps=False`: no maps or rank histograms;
    `progress`: a progress bar over channels x leads (evaluate's console).
    """
    check_method(method)
    models = [forecast] + ([baseline] if baseline is not None else [])
    for m in models:
        m.check_members()
    cfg = _Settings(region, skipna, n_bootstrap, confidence, significance, method, intervals, maps)
    inits, leads = forecast.data[INIT].values, forecast.data[LEAD].values
    has_clim = climatology is not None and all(ch.variable in climatology for ch in channels)
    metric_sets = [metrics_for(m.n_members(), m.nested_draws(), has_clim, metrics) for m in models]
    shape = (len(channels), len(leads))
    rows: dict[str, list] = {}
    n_init, block = np.zeros(shape, dtype=np.int64), np.zeros(shape, dtype=np.int64)
    nan_points = np.zeros(len(channels), dtype=np.int64)
    maps: dict[str, list] = {}
    hists: list = []
    rng = np.random.default_rng(seed)
    # only on a terminal (None: off when stderr is not one); cleared before an error, so that stays one line
    bar = tqdm(total=len(channels) * len(leads), desc="scoring", unit="lead", disable=None if progress else True)
    try:
        for c, ch in enumerate(channels):
            clim_da = select_channel(climatology, ch).astype(np.float64) if has_clim else None
            truth_da = select_channel(truth, ch)
            for j, lead in enumerate(leads):
                what = f"{forecast.name} '{ch.name}' lead {lead / np.timedelta64(1, 'h'):g} h"
                t = _finite(truth_at(truth_da, inits, lead, what).load().astype(np.float64))
                fields = [_finite(select_channel(m.data, ch).sel({LEAD: lead}).load().astype(np.float64))
                          for m in models]
                nans = _nan_count(t, *fields)
                if nans and not skipna:
                    raise DataError(f"{what}: {nans} missing (NaN) or infinite values in forecast or truth "
                                    "(set skipna=true to skip them)")
                nan_points[c] += nans
                clim = None
                if clim_da is not None:
                    valid = xr.DataArray(inits + lead, dims=[INIT], coords={INIT: inits})
                    clim = det.climatology_at(clim_da, valid)
                row, lead_maps, hist, n_init[c, j], block[c, j] = _score_lead(
                    models, metric_sets, fields, t, clim, what, cfg, rng)
                for k, v in row.items():
                    rows.setdefault(k, []).append(v)
                for k, v in lead_maps.items():
                    maps.setdefault(k, []).append(v)
                bar.update()
                hists.append(hist)
    except BaseException:
        bar.leave = False
        raise
    finally:
        bar.close()
    out = {k: np.stack(v).reshape(*shape, -1) for k, v in rows.items()}
    ds = _assemble(out, metric_sets[0], channels, leads, n_init, block, nan_points, maps, hists)
    units = [channel_units(ch, truth, forecast.data) for ch in channels]
    ds = ds.assign_coords(units=("channel", units))
    ds["has_intervals"] = (("channel", LEAD), (block > 0).astype(np.int64))
    ds.attrs.update(forecast=forecast.name, baseline=baseline.name if baseline is not None else "",
                    significance_method=method, intervals=intervals_state(ds))
    if baseline is not None:
        ds.attrs["rel_diff_convention"] = REL_DIFF_CONVENTION
    return ds


def intervals_state(ds: xr.Dataset) -> str:
    """"all", "partial" or "none": where the scorecard has intervals and tests (`has_intervals`)."""
    has = ds["has_intervals"].values
    return "all" if has.all() else "none" if not has.any() else "partial"


def channel_units(ch: Channel, *sources: xr.Dataset) -> str:
    """The `units` attribute of the channel's variable in the first source that has one ("" if none)."""
    for ds in sources:
        if ch.variable in ds.variables and ds[ch.variable].attrs.get("units"):
            return str(ds[ch.variable].attrs["units"])
    return ""


def _score_units(units: str, power: int) -> str:
    if not units or power == 0:
        return ""
    return units if power == 1 else f"({units})**{power}"


def _assemble(out, metrics, channels, leads, n_init, block, nan_points, maps, hists) -> xr.Dataset:
    dims3 = ("channel", LEAD, "metric")
    levels = [ch.level if ch.level is not None else -1 for ch in channels]  # -1: a surface variable
    ds = xr.Dataset({k: (dims3, v) for k, v in out.items()},
                    coords={"channel": [ch.name for ch in channels], LEAD: leads,
                            "metric": [m.name for m in metrics],
                            "variable": ("channel", [ch.variable for ch in channels]),
                            "level": ("channel", levels),
                            "higher_is_better": ("metric", [int(m.higher_is_better) for m in metrics]),
                            "unit_power": ("metric", [m.unit_power for m in metrics])})
    ds["n_init"] = (("channel", LEAD), n_init)
    ds["block_length"] = (("channel", LEAD), block)
    ds["nan_points"] = (("channel",), nan_points)
    nc, nl = len(channels), len(leads)
    for k, fields in maps.items():
        stacked = np.stack([f.transpose(LAT, LON).values for f in fields])
        ds[k] = (("channel", LEAD, LAT, LON), stacked.reshape(nc, nl, *stacked.shape[1:]))
        ds = ds.assign_coords({LAT: fields[0][LAT].values, LON: fields[0][LON].values})
    if hists and hists[0] is not None:
        values = np.stack([h.transpose("rank").values for h in hists]).reshape(nc, nl, -1)
        ds["rank_histogram"] = (("channel", LEAD, "rank"), values)
        ds = ds.assign_coords(rank=hists[0]["rank"].values)
    return ds


def scorecard_table(ds: xr.Dataset) -> pd.DataFrame:
    """Long table: one row per channel x lead x applicable metric. `units` are the score's own (the variable's
    for RMSE, squared for a variance, empty for ACC, SSIM, ratios); `level` is empty for a surface field."""
    cols = [k for k in ds.data_vars if ds[k].dims == ("channel", LEAD, "metric")]
    df = ds[cols].to_dataframe().reset_index()
    df = df[df["value"].notna()].copy()  # NaN: not applicable; inf (e.g. SSR of an error-free mean) stays
    if "level" in df:
        df["level"] = df["level"].where(df["level"] >= 0).astype("Int64")
    if "unit_power" in df:
        power = df.pop("unit_power")
        if "units" in df:
            df["units"] = [_score_units(str(u), int(p)) for u, p in zip(df["units"], power, strict=True)]
    df.insert(2, "lead_hours", df.pop(LEAD) / np.timedelta64(1, "h"))
    extra = ds[["n_init", "block_length"]].to_dataframe().reset_index()
    extra["lead_hours"] = extra.pop(LEAD) / np.timedelta64(1, "h")
    df = df.merge(extra[["channel", "lead_hours", "n_init", "block_length"]], on=["channel", "lead_hours"])
    return df.reset_index(drop=True)
