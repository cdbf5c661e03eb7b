"""The data jobs (`jobs/prepare_data.py`, `jobs/make_sample_data.py`, `wxray prepare-data|make-sample-data`):
typed configs and their `main` functions."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from wxray.config import InPath, NonNegInt, OutDir, PosInt, Range, Seed
from wxray.data.anchors import parse_range
from wxray.data.convert import prepare_data
from wxray.data.make_view import MapFn, make_view
from wxray.data.sample import make_sample_store
from wxray.errors import ConfigError
from wxray.job import JobConfig, JobContext

ClimWindow = Annotated[int, Range(0, 183)]  # a circular day-of-year window of at most half a year


def parse_grid(grid: str) -> tuple[int, int]:
    """'32x64' -> (32, 64) (n_lat x n_lon)."""
    try:
        nlat, nlon = (int(x) for x in str(grid).lower().split("x"))
    except ValueError:
        raise ConfigError(f"config key 'grid' expects NLATxNLON like '32x64', got {grid!r}") from None
    if nlat < 8 or nlon < 16 or nlat % 2:
        raise ConfigError(f"config key 'grid' expects an even n_lat >= 8 and n_lon >= 16, got {grid!r}")
    return nlat, nlon


@dataclass
class PrepareDataConfig(JobConfig):
    """`jobs/prepare_data.py source=<file|glob|zarr> out=<store> ...`"""

    source: InPath = ""  # a GRIB / NetCDF file, a glob of them, or a zarr store (mode=view: a zarr store or its URL)
    out: OutDir = ""  # the store to write (zarr v3 directory); mode=view: the sidecar, a folder or a URL
    # copy: convert the fields into a wxray store; view: read a WeatherBench 2 / ARCO-ERA5 zarr store in place
    # through a small sidecar of statistics (wxray/data/view.py)
    mode: Literal["copy", "view"] = "copy"
    time_range: str = ""  # mode=view: "start/end" (inclusive) of the times the view shows; "" = all
    time_stride: PosInt = 1  # mode=view: statistics from pairs of consecutive steps every this many steps
    variables: list[str] = field(default_factory=list)  # long or short names; [] = every gridded variable
    levels: list[PosInt] = field(default_factory=list)  # hPa; [] = every level in the source
    member: NonNegInt | Literal["mean"] | None = None  # ensemble sources: a member number or the ensemble mean
    allow_missing: bool = False  # keep NaN / missing values (masked) instead of rejecting the source
    clim_window_days: ClimWindow = 15  # half width (days) of the day-of-year window of the climatology
    overwrite: bool = False  # replace an existing store at `out`

    experiment = "wxray-data"

    def validate(self) -> None:
        if not self.source:
            raise ConfigError("config key 'source' is required (a GRIB/NetCDF file, a glob or a zarr store)")
        if not self.out:
            raise ConfigError("config key 'out' is required (the zarr store to write)")
        if self.mode == "copy":
            for key in ("time_range", "time_stride"):
                if getattr(self, key) != getattr(PrepareDataConfig, key):
                    raise ConfigError(f"config key '{key}' is for mode=view (a store read in place)")
        elif self.member is not None or self.allow_missing:
            raise ConfigError("mode=view reads the source's fields as they are: 'member' and 'allow_missing' "
                              "are for mode=copy")
        if self.time_range:
            parse_range(self.time_range, "time_range")


@dataclass
class SampleDataConfig(JobConfig):
    """`jobs/make_sample_data.py out=<store> grid=32x64 days=<n> seed=<s> trajectories=<k>`"""

    out: OutDir = "data/sample_32x64.zarr"  # the store to write; this default is the training job's
    grid: str = "32x64"  # n_lat x n_lon of the equiangular grid (poles included)
    days: PosInt = 25  # days kept per trajectory (4 steps a day)
    seed: Seed = 0  # seed of the random initial states
    trajectories: PosInt = 4  # independent runs laid end to end along time
    spinup_days: NonNegInt = 5  # integrated and discarded before each trajectory's first kept step
    clim_window_days: ClimWindow = 15  # half width (days) of the day-of-year window of the climatology
    overwrite: bool = False  # replace an existing store at `out`

    experiment = "wxray-data"

    def validate(self) -> None:
        parse_grid(self.grid)


def prepare_data_main(cfg: PrepareDataConfig, ctx: JobContext, map_fn: MapFn = map) -> dict[str, Any]:
    """The job; `map_fn` runs a view's statistics tasks (Ray tasks from jobs/prepare_data.py)."""
    t0 = time.perf_counter()
    if cfg.mode == "view":
        view = make_view(cfg.source, cfg.out, cfg.variables, cfg.levels, cfg.time_range, cfg.time_stride,
                         cfg.clim_window_days, cfg.overwrite, map_fn=map_fn)
        figures = {**view.figures(), "seconds": round(time.perf_counter() - t0, 2)}
        ctx.tracker.log_metrics({"n_times": view.n_times, "n_variables": len(view.variables),
                                 "stats_steps": view.stats_steps, "seconds": figures["seconds"]})
        return figures
    result = prepare_data(cfg)
    figures = {**result.figures(), "seconds": round(time.perf_counter() - t0, 2)}
    ctx.tracker.log_metrics({"n_times": result.n_times, "n_missing": result.n_missing,
                             "n_variables": len(result.variables), "seconds": figures["seconds"]})
    return figures


def make_sample_main(cfg: SampleDataConfig, ctx: JobContext) -> dict[str, Any]:
    result = make_sample_store(cfg.out, grid=parse_grid(cfg.grid), days=cfg.days, seed=cfg.seed,
                               trajectories=cfg.trajectories, spinup_days=cfg.spinup_days,
                               clim_window_days=cfg.clim_window_days, overwrite=cfg.overwrite)
    ctx.tracker.log_metrics({"n_times": result.n_times, "generate_seconds": result.seconds})
    return result.figures()

