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

Streamed: per channel and lead, blocks of inits (all their members; latitude bands where one init exceeds the
budget: `verify.blocks`) are scored one at a time (`verify.streaming.score_block`, through a pluggable
`map_blocks`) into per-init series, map sums and rank counts; the aggregates, intervals and DM tests are then
computed from the whole series as before. Peak memory is a few blocks, whatever the inits or members.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import xarray as xr
from tqdm.auto import tqdm

from wxray.data.schema import INIT, LAT, LEAD, LON, Channel, select_channel
from wxray.errors import DataError
from wxray.verify import deterministic as det
from wxray.verify import ensemble as ens
from wxray.verify.blocks import DEFAULT_BLOCK_MIB, MIB, BlockPlan, block_map, plan_blocks
from wxray.verify.ensemble_metrics import histogram_from_counts, maps_from_sums
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
from wxray.verify.metrics import Metric, metrics_for, nested_draws
from wxray.verify.streaming import BlockTask, LeadSums, score_block

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


def _score_lead(series: list[dict[str, np.ndarray]], metric_sets: list[list[Metric]], what: str, cfg: _Settings,
                rng: np.random.Generator) -> tuple[dict[str, np.ndarray], int, int]:
    """All metrics of one channel at one lead from each model's per-init series: {field: values per metric}, n, ell."""
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
    if len(series) > 1:
        row.update({k: np.full(len(names), np.nan) for k in BASELINE_FIELDS})
    by_name = [{m.name: m for m in ms} for ms in metric_sets]
    for i, name in enumerate(names):
        metric = by_name[0][name]
        v = _interval(series[0], metric, idx, cfg.confidence)
        row["value"][i], row["ci_lower"][i], row["ci_upper"][i] = v
        if len(series) == 1 or metric.loss is None or name not in by_name[1]:
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
    return row, n, ell


def _tasks(models: list[Model], metric_sets: list[list[Metric]], truth: xr.Dataset, climatology: xr.Dataset | None,
           channels: list[Channel], cfg: _Settings, plan: BlockPlan) -> Iterator[BlockTask]:
    """Every block, channel by channel, lead by lead, init block by init block: lazy selections (read by
    `score_block`). The truth and climatology are looked up for all inits first: a missing valid time fails
    naming them all."""
    inits, leads = models[0].data[INIT].values, models[0].data[LEAD].values
    for ch in channels:
        truth_da = select_channel(truth, ch)
        clim_da = select_channel(climatology, ch) if climatology is not None else None
        for lead in leads:
            t = truth_at(truth_da, inits, lead, _what(models[0], ch, lead))
            clim = None
            if clim_da is not None:
                clim = det.climatology_at(clim_da, xr.DataArray(inits + lead, dims=[INIT], coords={INIT: inits}))
            fields = [select_channel(m.data, ch).sel({LEAD: lead}) for m in models]
            for block in plan.init_slices(len(inits)):
                at = {INIT: block}
                yield BlockTask([f.isel(at) for f in fields], t.isel(at), clim.isel(at) if clim is not None else None,
                                [m.member_dims for m in models], metric_sets, cfg.region, cfg.skipna, cfg.maps,
                                plan.rows)


def _what(forecast: Model, ch: Channel, lead: np.timedelta64) -> str:
    return f"{forecast.name} '{ch.name}' lead {lead / np.timedelta64(1, 'h'):g} h"


def build_scorecard(forecast: Model, truth: xr.Dataset, channels: list[Channel], *,
                    climatology: xr.Dataset | None = None, baseline: Model | None = None,
                    region=None, skipna: bool = False, n_bootstrap: int = 5000, confidence: float = 0.95,
                    significance: float = 0.05, seed: int = 0, method: str = DEFAULT_METHOD,
                    metrics: Sequence[str] | None = None, intervals: bool = True, maps: bool = True,
                    progress: bool = False, init_block: int = 0, block_mib: float = DEFAULT_BLOCK_MIB,
                    workers: int = 1, map_blocks: Callable | None = None) -> xr.Dataset:
    """Score `forecast` (and compare with `baseline`) on every channel x lead; see the module doc.

    `method`: "fixed-b" (default) or "paper", see `wxray.verify.inference`; n_bootstrap and seed apply to "paper".
    `metrics`: only these of `verify.metrics.METRICS` (default: every one that applies); `intervals=False`: the
    scores alone (no intervals or tests, as with too few inits); `maps=False`: no maps or rank histograms;
    `progress`: a progress bar over channels x leads (evaluate's console).
    Streamed (`verify.blocks`, `verify.streaming`): `init_block` inits per block (0: as many as `block_mib` MiB
    of float64 members, truth and climatology hold; latitude bands where one init exceeds it), scored by
    `map_blocks` (builtin `map` signature, results in order; default: `block_map(workers)`). The scorecard is
    the same for any of these: to the bit for `workers` and `map_blocks`, to rounding for blocks and bands.
    """
    check_method(method)
    models = [forecast] + ([baseline] if baseline is not None else [])
    for m in models:
        m.check_members()
    cfg = _Settings(region, skipna, n_bootstrap, confidence, significance, method, intervals, maps)
    inits, leads = forecast.data[INIT].values, forecast.data[LEAD].values
    has_clim = climatology is not None and all(ch.variable in climatology for ch in channels)
    metric_sets = [metrics_for(m.n_members(), m.nested_draws(), has_clim, metrics) for m in models]
    plan = plan_blocks(len(inits), truth.sizes[LAT], truth.sizes[LON],
                       max(m.n_members() for m in models) + 1 + int(has_clim), init_block, int(block_mib * MIB))
    shape = (len(channels), len(leads))
    rows: dict[str, list] = {}
    n_init, block = np.zeros(shape, dtype=np.int64), np.zeros(shape, dtype=np.int64)
    nan_points = np.zeros(len(channels), dtype=np.int64)
    maps_: dict[str, list] = {}
    hists: list = []
    rng = np.random.default_rng(seed)
    tasks = _tasks(models, metric_sets, truth, climatology if has_clim else None, channels, cfg, plan)
    results = iter((map_blocks or block_map(workers))(score_block, tasks))
    n_blocks = len(plan.init_slices(len(inits)))
    grid = truth[LAT].values, truth[LON].values
    # only on a terminal (None: off when stderr is not one); cleared before an error, so that stays one line
    bar = tqdm(total=len(channels) * len(leads), desc="scoring", unit="lead", disable=None if progress else True)
    try:
        for c, ch in enumerate(channels):
            for j, lead in enumerate(leads):
                what = _what(forecast, ch, lead)
                sums = LeadSums(len(models))
                for _ in range(n_blocks):
                    sums.add(next(results))
                if sums.nans and not skipna:
                    raise DataError(f"{what}: {sums.nans} missing (NaN) or infinite values in forecast or truth "
                                    "(set skipna=true to skip them)")
                nan_points[c] += sums.nans
                row, n_init[c, j], block[c, j] = _score_lead(sums.series(), metric_sets, what, cfg, rng)
                for k, v in row.items():
                    rows.setdefault(k, []).append(v)
                for k, v in maps_from_sums(sums.sums, *grid).items():
                    maps_.setdefault(k, []).append(v)
                hists.append(histogram_from_counts(sums.counts) if sums.counts is not None else None)
                bar.update()
    except BaseException:
        bar.leave = False
        raise
    finally:
        bar.close()
        close = getattr(results, "close", None)
        if close is not None:  # a generator map (ProcessMap): stop its workers now
            close()
    out = {k: np.stack(v).reshape(*shape, -1) for k, v in rows.items()}
    ds = _assemble(out, metric_sets[0], channels, leads, n_init, block, nan_points, maps_, hists)
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
