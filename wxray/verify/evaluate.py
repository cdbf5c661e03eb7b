"""The evaluate job: config, input checks, scorecard, outputs (jobs/evaluate.py is a thin wrapper).

    python jobs/evaluate.py forecast=fc.zarr truth=store.zarr [baseline=other.zarr|persistence] \
        [variables=[geopotential]] [levels=[500]] [regrid=true] [skipna=true] [n_bootstrap=5000]
    python jobs/evaluate.py stations=st.parquet station_obs=obs_dir [station_baseline=bilinear forecast=fc.zarr]

Outputs in the run directory: scorecard.nc (layout in `wxray.verify.scorecard`), scorecard.csv (one row per
channel x lead x metric), plots/*.png (`wxray.verify.plots`: score vs lead, WeatherBench-2-style heatmaps
scorecard_<metric>.png against a baseline, spread-skill, rank histograms, maps) and the RESULT line
(`headline`: scores, baseline scores and rel_diff = forecast / baseline - 1 at the first and last lead).
Channels come in the configured order, else sorted. A forecast on a block of the truth grid (cropped to fit
a model) is scored on those truth points; baseline and climatology are cut to them too.

With `stations` a station forecast (Parquet) is scored against a point stream of an obs dir
(`wxray.verify.stations`: RMSE, bias, MAE per variable and lead, per-station RMSE; beside a second station
forecast or the bilinear interpolation of the gridded `forecast`, on the same pairs): stations.csv (one row
per variable x lead), stations.nc and a `stations` block in RESULT (`scores_summary`). With `truth` empty
only the stations are scored (the gridded `forecast`, if given, is then only the bilinear baseline).

Everything is scored before anything is written, and each output is written atomically, so a bad
input leaves no partial scorecard behind. Scoring is streamed in blocks of inits (`init_block`, `block_mib`,
`workers`: `wxray.verify.blocks`); the plots are drawn from the scorecard alone, never from the fields.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import pandas as pd
import xarray as xr

from wxray.config import InPath, NonNegInt, PathKey, PosInt, Range, Seed
from wxray.console import say
from wxray.data.schema import INIT, LAT, LEAD, LON, TIME, channels, longitude_convention
from wxray.errors import ConfigError, DataError
from wxray.io import atomic_path
from wxray.job import JobConfig, JobContext
from wxray.verify import metrics
from wxray.verify.blocks import DEFAULT_BLOCK_MIB
from wxray.verify.digest import digest
from wxray.verify.forecasts import (
    check_grid,
    crop_to,
    drop_member,
    open_forecast,
    open_truth,
    orient,
    persistence_forecast,
    same_grid,
    truth_at,
)
from wxray.verify.inference import MIN_FIXED_B_LENGTH, MIN_SERIES_LENGTH
from wxray.verify.plots import write_plots
from wxray.verify.scorecard import REL_DIFF_CONVENTION, Model, build_scorecard, scorecard_table
from wxray.verify.spatial import RegionName
from wxray.verify.stations import log_station_metrics, scores_summary, scores_table, station_evaluation

Baseline = Annotated[str, PathKey(keywords=("persistence",))]
StationBaseline = Annotated[str, PathKey(keywords=("bilinear",))]


@dataclass
class EvaluateConfig(JobConfig):
    forecast: InPath = ""  # forecast zarr (or netCDF/GRIB) in the init_time x lead_time convention
    truth: InPath = ""  # a wxray store, or an ERA5 netCDF/GRIB file with a time dim
    baseline: Baseline = ""  # a second forecast, or "persistence" (from the truth at the same inits)
    variables: list[str] = field(default_factory=list)  # empty: every forecast variable the truth has
    levels: list[PosInt] = field(default_factory=list)  # hPa; empty: every level of the forecast
    region: RegionName = "global"  # a key of wxray.verify.spatial.REGIONS: global, tropics, europe, ...
    regrid: bool = False  # interpolate forecast/baseline onto the truth grid instead of failing
    skipna: bool = False  # skip NaN points (counted in the scorecard) instead of failing
    truth_member: str = ""  # truth with members: "mean" or a held-out member index
    make_persistence: bool = False  # score persistence built from the truth instead of `forecast`
    leads: list[NonNegInt] = field(default_factory=lambda: [24])  # hours, for make_persistence
    # block-bootstrap resamples (the paper's 5e3); only significance_method=paper resamples, fixed-b ignores it
    n_bootstrap: Annotated[int, Range(100)] = 5000
    confidence: Annotated[float, Range(0, 1, True, True)] = 0.95  # level of the intervals (either method)
    significance: Annotated[float, Range(0, 1, True, True)] = 0.05  # Diebold-Mariano level for "significant"
    # "fixed-b": prewhitened HAC test and intervals that hold their level; "paper": Wilks block bootstrap + HLN DM
    significance_method: Literal["fixed-b", "paper"] = "fixed-b"
    seed: Seed = 0  # seed of the bootstrap resampling (significance_method=paper only)
    plots: bool = True  # write the scorecard figures (plots/*.png)
    # Streamed scoring (wxray.verify.blocks): a block is init_block inits of one channel and lead with all their
    # members; 0 takes as many as block_mib MiB of float64 members, truth and climatology hold (latitude bands
    # where one init exceeds it). Peak memory is a few block_mib per worker, whatever the inits or members.
    init_block: NonNegInt = 0  # inits per scoring block (0: as many as block_mib holds)
    # MiB of float64 members, truth and climatology per block; scoring holds ~4-5 blocks per worker
    block_mib: Annotated[float, Range(0, None, True)] = float(DEFAULT_BLOCK_MIB)
    workers: PosInt = 1  # processes scoring blocks (1: this one); the scorecard is the same for any number
    # > 0: blocks on Ray tasks across the cluster, this many at a time (instead of `workers` processes here)
    ray_tasks: NonNegInt = 0
    ray_address: str = ""  # ray_tasks > 0: "" = RAY_ADDRESS under ray job submit, else a local cluster
    stations: InPath = ""  # station forecast Parquet: init_time, lead_time [h], station, lat, lon, variable, value
    station_obs: InPath = ""  # obs dir (obs.yaml + point streams) whose `station_stream` is the station truth
    station_stream: str = "stations"  # the point stream of station_obs scored against (quality 0 observations)
    station_baseline: StationBaseline = ""  # "bilinear" (`forecast` interpolated to the stations) or a station Parquet

    experiment = "wxray-evaluate"
    columns = (*(f"{prefix}{m}/*" for prefix in ("", "rel_diff/") for m in metrics.key_comparisons()),
               "stations/rmse/*")  # at the last lead

    def validate(self) -> None:
        gridded = bool(self.forecast) or self.make_persistence
        if (self.forecast and self.make_persistence) or not (gridded or self.stations):
            raise ConfigError("give exactly one of forecast=<zarr> or make_persistence=true (or stations=<parquet>)")
        bilinear_only = self.stations and self.forecast and self.station_baseline == "bilinear"
        if not self.truth and not (bilinear_only or (self.stations and not gridded)):
            raise ConfigError("config key 'truth' is required (a store or an ERA5 netCDF/GRIB file)")
        if self.truth and not gridded:
            raise ConfigError("config key 'truth' scores a gridded forecast: give forecast=<zarr> or "
                              "make_persistence=true, or leave truth empty to score only the stations")
        self._validate_stations()
        if self.truth_member not in ("", "mean") and not self.truth_member.isdigit():
            raise ConfigError(f"config key 'truth_member' expects '', 'mean' or a member index, "
                              f"got {self.truth_member!r}")
        if self.make_persistence and not self.leads:
            raise ConfigError("config key 'leads' needs at least one lead in hours")

    def _validate_stations(self) -> None:
        if not self.stations:
            for key in ("station_obs", "station_baseline"):
                if getattr(self, key):
                    raise ConfigError(f"config key '{key}' needs stations=<station forecast parquet>")
            return
        if not self.station_obs:
            raise ConfigError("config key 'station_obs' is required with stations= (the obs dir of the station truth)")
        if not self.station_stream:
            raise ConfigError("config key 'station_stream' must name a point stream of station_obs")
        if self.station_baseline == "bilinear" and not self.forecast:
            raise ConfigError("config key 'station_baseline': bilinear interpolates the gridded forecast; "
                              "give forecast=<zarr>")


def _prepare(ds: xr.Dataset, truth: xr.Dataset, name: str, regrid: bool) -> xr.Dataset:
    inits = pd.DatetimeIndex(ds[INIT].values)
    if inits.has_duplicates:
        raise DataError(f"{name}: duplicate init_time values")
    ds = ds.sortby(INIT).sortby(LEAD)  # the serial-correlation estimates assume time order
    return check_grid(ds, truth, name, regrid)


def _crop_truth(truth: xr.Dataset, climatology: xr.Dataset | None, grid: xr.Dataset, what: str):
    """Truth and climatology on the points of a forecast grid cut out of the truth grid (index selections),
    oriented again (a box cut across 0 E goes to (-180, 180], as its own store would be)."""
    truth = crop_to(truth, grid, what)
    if climatology is not None:
        climatology = crop_to(climatology, truth, f"{what} stats/climatology")
    truth = orient(truth, what)
    if climatology is not None:
        climatology = orient(climatology, f"{what} stats/climatology", longitude_convention(truth[LON].values))
    return truth, climatology


def _same_file(a: str, b: str) -> bool:
    return bool(a) and Path(a).resolve() == Path(b).resolve()


def _persistence_inits(truth: xr.Dataset, leads_h: list[int]) -> np.ndarray:
    times = pd.DatetimeIndex(truth[TIME].values)
    span = np.timedelta64(max(leads_h), "h")
    inits = times[times + span <= times.max()]
    inits = inits[(inits + span).isin(times)]
    if len(inits) == 0:
        raise DataError(f"truth: no init time has truth {max(leads_h)} h later "
                        f"(truth covers {times.min()} to {times.max()})")
    return inits.values


def load_inputs(cfg: EvaluateConfig):
    """Forecast model, baseline model (or None), truth, climatology and channels, all checked."""
    truth, climatology = open_truth(cfg.truth, cfg.truth_member)
    if climatology is not None and not same_grid(climatology, truth):
        raise DataError(f"truth {cfg.truth}: stats/climatology is on a different grid than the truth")
    if cfg.make_persistence:
        inits = _persistence_inits(truth, cfg.leads)
        data = persistence_forecast(truth, inits, cfg.leads, cfg.variables or None)
        forecast = Model("persistence", data)
    else:
        data = open_forecast(cfg.forecast)
        if _same_file(cfg.forecast, cfg.truth):
            data = drop_member(data, cfg.truth_member)  # score against a held-out member, not itself
        forecast = Model(f"forecast {cfg.forecast}", data)
    forecast.data = _prepare(forecast.data, truth, forecast.name, cfg.regrid)
    if not same_grid(forecast.data, truth):  # a cropped forecast: scored on the truth's points it has
        truth, climatology = _crop_truth(truth, climatology, forecast.data, f"truth {cfg.truth}")
        forecast.data = check_grid(forecast.data, truth, forecast.name, False)
    # Configured order, else sorted: a store does not promise an order of its variables (stable panels)
    names = cfg.variables or sorted(str(v) for v in forecast.data.data_vars if v in truth.data_vars)
    unscored = {} if cfg.variables else {
        "forecast_only": sorted(str(v) for v, a in forecast.data.data_vars.items()
                                if v not in truth.data_vars and INIT in a.dims),
        "truth_only": sorted(str(v) for v, a in truth.data_vars.items()
                             if v not in forecast.data.data_vars and TIME in a.dims)}
    if not names:
        raise DataError(f"{forecast.name}: no variable in common with truth {cfg.truth} "
                        f"(forecast has {', '.join(map(str, forecast.data.data_vars))})")
    chans = channels(forecast.data, names, cfg.levels, source=forecast.name)
    for ch in chans:
        levels = [ch.level] if ch.level is not None else []
        channels(truth, [ch.variable], levels, source=f"truth {cfg.truth}")
    inits, leads = forecast.data[INIT].values, forecast.data[LEAD].values
    for lead in leads:  # fail on a lead without truth before any scoring
        truth_at(truth[chans[0].variable], inits, lead, f"{forecast.name} '{chans[0].name}'")
    baseline = None
    if cfg.baseline == "persistence":
        baseline = Model("baseline persistence", persistence_forecast(truth, inits, leads, names))
    elif cfg.baseline:
        baseline = Model(f"baseline {cfg.baseline}", open_forecast(cfg.baseline, "baseline"))
        baseline.data = _prepare(baseline.data, truth, baseline.name, cfg.regrid)
        if not same_grid(baseline.data, forecast.data):  # e.g. a baseline cropped where the forecast is not
            raise DataError(f"{baseline.name}: grid {baseline.data.sizes[LAT]}x{baseline.data.sizes[LON]} differs "
                            f"from the forecast's {forecast.data.sizes[LAT]}x{forecast.data.sizes[LON]}; a "
                            f"comparison needs both on the same points (regrid=true interpolates onto the truth)")
        channels(baseline.data, names, cfg.levels, source=baseline.name)
        for dim, wanted in ((INIT, inits), (LEAD, leads)):
            missing = pd.Index(wanted).difference(pd.Index(baseline.data[dim].values))
            if len(missing):
                raise DataError(f"{baseline.name}: lacks {len(missing)} of the forecast's {dim} values "
                                f"(first: {missing[0]}); comparisons need identical inits and leads")
        baseline.data = baseline.data.sel({INIT: inits, LEAD: leads})
    return forecast, baseline, truth, climatology, chans, {k: v for k, v in unscored.items() if v}


def _say_unscored(unscored: dict[str, list[str]], forecast: str, truth: str) -> None:
    """A variable one side lacks is not scored: say so (a renamed variable would otherwise just vanish)."""
    if unscored.get("forecast_only"):
        say(f"warning: not scored, only in the {forecast}: {', '.join(unscored['forecast_only'])} "
            f"(truth {truth} has no variable of that name)")
    if unscored.get("truth_only"):
        say(f"warning: not scored, only in truth {truth}: {', '.join(unscored['truth_only'])}")


def headline(card: xr.Dataset) -> dict[str, Any]:
    """RESULT figures: the main scores at the first and last lead (`<metric>.<channel>.<lead>h`), with a
    baseline its scores (`baseline.<metric>...`) and relative differences (`rel_diff.<metric>...`, sign
    convention in `rel_diff_convention`), the mean relative difference and the comparison counts."""
    hours = card[LEAD].values / np.timedelta64(1, "h")
    out: dict[str, Any] = {"n_channels": card.sizes["channel"], "leads_h": [float(h) for h in hours],
                           "n_init": int(card["n_init"].min()), "nan_points": int(card["nan_points"].sum())}
    out["n_members"] = int(card.attrs["n_members"])
    out["intervals"] = str(card.attrs.get("intervals", "all"))  # "none"/"partial": too few inits for the method
    if "units" in card.coords:
        out["units"] = {str(ch): str(u) for ch, u in zip(card["channel"].values, card["units"].values)}
    compared = "significant" in card
    fields = [("", "value")] + ([("baseline.", "baseline_value"), ("rel_diff.", "rel_diff")] if compared else [])
    for metric in metrics.headline_names():
        if metric not in card["metric"].values:
            continue
        for prefix, name in fields:
            for ch in card["channel"].values:
                for j in sorted({0, len(hours) - 1}):
                    v = float(card[name].sel(channel=ch, metric=metric).isel({LEAD: j}))
                    if np.isfinite(v):
                        out[f"{prefix}{metric}.{ch}.{hours[j]:g}h"] = v
    if compared:
        sig, rel = card["significant"], card["rel_diff"]
        better = xr.where(card["higher_is_better"] == 1, rel > 0, rel < 0)
        out["baseline"] = str(card.attrs.get("baseline", ""))
        out["rel_diff_convention"] = REL_DIFF_CONVENTION
        out["n_compared"] = int(np.isfinite(sig).sum())
        out["n_significant_better"] = int(((sig == 1) & better).sum())
        out["n_significant_worse"] = int(((sig == 1) & ~better).sum())
        for metric in metrics.key_comparisons():
            if metric in card["metric"].values:
                out[f"mean_rel_diff.{metric}"] = float(rel.sel(metric=metric).mean())
    return out


def _log_metrics(card: xr.Dataset, ctx: JobContext) -> None:
    # One MLflow metric per score and channel, `<score>/<channel>` and `rel_diff/<score>/<channel>`, with the lead
    # in hours as the step: curves vs lead. RESULT's keys are the same names with dots and the lead appended.
    hours = card[LEAD].values / np.timedelta64(1, "h")
    for j, h in enumerate(hours):
        values = {}
        for ch in card["channel"].values:
            for m in card["metric"].values:
                values[f"{m}/{ch}"] = float(card["value"].sel(channel=ch, metric=m).isel({LEAD: j}))
                if "rel_diff" in card:
                    rel = card["rel_diff"].sel(channel=ch, metric=m).isel({LEAD: j})
                    values[f"rel_diff/{m}/{ch}"] = float(rel)
        ctx.tracker.log_metrics(values, step=int(round(h)))


def min_inits(method: str) -> str:
    if method == "fixed-b":
        return f"at least {MIN_FIXED_B_LENGTH}"
    return f"at least {MIN_SERIES_LENGTH} and twice the block length"


def score_stations(cfg: EvaluateConfig) -> xr.Dataset:
    """Station scores (`wxray.verify.stations`) of `stations`, beside its baseline on the same pairs."""
    bilinear = cfg.station_baseline == "bilinear"
    return station_evaluation(cfg.stations, cfg.station_obs, cfg.station_stream,
                              gridded=open_forecast(cfg.forecast) if bilinear else None,
                              gridded_name=f"forecast {cfg.forecast}",
                              baseline="" if bilinear else cfg.station_baseline)


def _write_stations(scores: xr.Dataset, ctx: JobContext) -> dict[str, Any]:
    out = ctx.out_dir
    with atomic_path(out / "stations.nc") as tmp:
        scores.to_netcdf(tmp)
    with atomic_path(out / "stations.csv") as tmp:
        scores_table(scores).to_csv(tmp, index=False, float_format="%.6g")
    for name in ("stations.nc", "stations.csv"):
        ctx.tracker.log_artifact(out / name)
    log_station_metrics(scores, ctx.tracker)
    block = {k: str(scores.attrs[k]) for k in ("forecast", "truth", "baseline")}
    return {**block, **scores_summary(scores), "csv": str(out / "stations.csv"), "netcdf": str(out / "stations.nc")}


def evaluate(cfg: EvaluateConfig, ctx: JobContext, map_blocks: Callable | None = None) -> dict[str, Any]:
    """The job; `map_blocks` scores the blocks (`wxray.platform.ensemble.evaluate` passes Ray tasks' when
    ray_tasks > 0; None: `workers` processes)."""
    stations = score_stations(cfg) if cfg.stations else None  # cheap: bad station input fails first
    if not cfg.truth:  # station-only (validate: stations is set)
        return {"stations": _write_stations(stations, ctx)}
    forecast, baseline, truth, climatology, chans, unscored = load_inputs(cfg)
    _say_unscored(unscored, forecast.name, cfg.truth)
    card = build_scorecard(forecast, truth, chans, climatology=climatology, baseline=baseline,
                           region=None if cfg.region == "global" else cfg.region, skipna=cfg.skipna,
                           n_bootstrap=cfg.n_bootstrap, confidence=cfg.confidence,
                           significance=cfg.significance, seed=cfg.seed, method=cfg.significance_method,
                           progress=True, init_block=cfg.init_block, block_mib=cfg.block_mib,
                           workers=cfg.workers, map_blocks=map_blocks)
    card.attrs.update(forecast=forecast.name, truth=cfg.truth, baseline=baseline.name if baseline else "",
                      n_members=forecast.n_members(), member_dims=",".join(forecast.member_dims),
                      region=cfg.region, n_bootstrap=cfg.n_bootstrap, confidence=cfg.confidence,
                      significance=cfg.significance, significance_method=cfg.significance_method,
                      acc="yes" if climatology is not None else "no climatology")
    if card.attrs["intervals"] != "all":
        say(f"warning: {int(card['n_init'].min())} initialisation(s) are too few for the "
            f"{cfg.significance_method} intervals and tests (it needs {min_inits(cfg.significance_method)}): "
            "scores without intervals or significance")
    out = ctx.out_dir
    if cfg.plots:
        with atomic_path(out / "plots") as tmp:
            write_plots(card, tmp)
    with atomic_path(out / "scorecard.nc") as tmp:
        card.to_netcdf(tmp)
    with atomic_path(out / "scorecard.csv") as tmp:
        scorecard_table(card).to_csv(tmp, index=False, float_format="%.6g")
    for name in ("scorecard.nc", "scorecard.csv"):
        ctx.tracker.log_artifact(out / name)
    if cfg.plots:
        ctx.tracker.log_artifact(out / "plots", artifact_path="plots")
    _log_metrics(card, ctx)
    for line in digest(card):
        say(line)
    result = {**headline(card), "scorecard": str(out / "scorecard.nc")}
    if unscored:
        result["unscored"] = unscored
    if stations is not None:
        result["stations"] = _write_stations(stations, ctx)
    return result
