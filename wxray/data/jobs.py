"""The data jobs (`jobs/prepare_data.py`, `jobs/make_sample_data.py`, `wxray prepare-data|make-sample-data`):
typed configs and their `main` functions."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from wxray.config import InPath, NonNegInt, OutDir, PosInt, Range, Seed
from wxray.data.convert import prepare_data
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

    source: InPath = ""  # a GRIB / NetCDF file, a glob of them, or a zarr store
    out: OutDir = ""  # the store to write (zarr v3 directory)
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


def prepare_data_main(cfg: PrepareDataConfig, ctx: JobContext) -> dict[str, Any]:
    t0 = time.perf_counter()
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

