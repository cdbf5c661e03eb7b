"""The observation jobs (`jobs/make_sample_obs.py`, `jobs/prepare_obs.py`, `wxray make-sample-obs|prepare-obs`):
typed configs and their `main` functions."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from wxray.config import AnyFloat, InPath, NonNegFloat, NonNegInt, OutDir, PosFloat, PosInt, Range, Seed
from wxray.data import location
from wxray.data.obs.prepare import prepare_obs
from wxray.data.obs.registry import check_name
from wxray.data.obs.sample import make_sample_obs
from wxray.errors import ConfigError
from wxray.job import JobConfig, JobContext

MissingShare = Annotated[float, Range(0, 0.9)]  # some reports must remain to compute statistics from
SuspectShare = Annotated[float, Range(0, 0.5)]


def parse_swath_grid(grid: str) -> tuple[int, int]:
    """'24x48' -> (24, 48) (n_lat x n_lon of the swath streams' own grid)."""
    try:
        nlat, nlon = (int(x) for x in str(grid).lower().split("x"))
    except ValueError:
        raise ConfigError(f"config key 'swath_grid' expects NLATxNLON like '24x48', got {grid!r}") from None
    if nlat < 4 or nlon < 8:
        raise ConfigError(f"config key 'swath_grid' expects n_lat >= 4 and n_lon >= 8, got {grid!r}")
    return nlat, nlon


def local_out(out: str) -> None:
    """Obs dirs are written on a local (or shared) file system; jobs read them from a URL once copied up."""
    if location.is_remote(out):
        raise ConfigError(f"config key 'out' = {out}: obs dirs are written to a folder; write it locally, "
                          "copy it up whole (e.g. aws s3 sync), then give its URL as obs_dir")


@dataclass
class SampleObsConfig(JobConfig):
    """`jobs/make_sample_obs.py store=<store> out=<obs dir> seed=<s>`"""

    store: InPath = "data/sample_32x64.zarr"  # the store the streams come from (this default is generated if missing)
    out: OutDir = "data/sample_obs"  # the obs dir to write (obs.yaml, points/, <gridded>.zarr)
    seed: Seed = 0  # seed of every random choice (sites, tracks, gaps, noise); the same seed gives the same files
    stations: PosInt = 300  # fixed stations (75% in three dense 'continent' boxes)
    ships: NonNegInt = 60  # moving platforms in the sparse regions; 0 = no ships stream
    profiles: NonNegInt = 40  # radiosonde-like sites reporting every other step; 0 = no profiles stream
    swath_grid: str = "24x48"  # n_lat x n_lon of the swath streams' own grid (cell centres, no poles)
    station_missing: MissingShare = 0.1  # share of station reports missing
    station_suspect: SuspectShare = 0.03  # share of station reports flagged suspect (with gross errors)
    overwrite: bool = False  # replace an existing obs dir at `out`

    experiment = "wxray-data"

    def validate(self) -> None:
        parse_swath_grid(self.swath_grid)
        local_out(self.out)


@dataclass
class PrepareObsConfig(JobConfig):
    """`jobs/prepare_obs.py source=<csv|parquet> out=<obs dir> stream=<name> [variables=[...]] ...`"""

    source: InPath = ""  # the station table: a .csv or .parquet file (columns id, time, lat, lon, variables)
    out: OutDir = ""  # the obs dir to write into (created, or extended: obs.yaml gains the stream)
    stream: str = ""  # the stream's name (letters, digits, '_' and '-')
    kind: Literal["point"] = "point"  # stream kind (tables give point streams)
    variables: list[str] = field(default_factory=list)  # columns to keep (or ERA5 short names); [] = all numeric
    step_hours: PosFloat = 6.0  # time step of the store the stream goes with (max_per_step counts reports per step)
    noise: dict[str, NonNegFloat] = field(default_factory=dict)  # obs-error std per variable; unlisted = unknown
    description: str = ""  # free text for obs.yaml; "" = the source file's name
    overwrite: bool = False  # replace an existing stream of that name in the obs dir
    bounds: dict[str, tuple[AnyFloat, AnyFloat]] = field(default_factory=dict)  # [lo, hi] per variable; {} = built-in

    experiment = "wxray-data"

    def validate(self) -> None:
        for k, (lo, hi) in self.bounds.items():
            if not lo < hi:
                raise ConfigError(f"config key 'bounds.{k}': [{lo:g}, {hi:g}] is not a range (expected lo < hi)")
        if not self.source:
            raise ConfigError("config key 'source' is required (a .csv or .parquet station table)")
        if not self.out:
            raise ConfigError("config key 'out' is required (the obs dir to write into)")
        local_out(self.out)
        if not self.stream:
            raise ConfigError("config key 'stream' is required (the name of the new stream)")
        check_name(self.stream, "config key 'stream'")


def make_sample_obs_main(cfg: SampleObsConfig, ctx: JobContext) -> dict[str, Any]:
    result = make_sample_obs(cfg.store, cfg.out, seed=cfg.seed, stations=cfg.stations, ships=cfg.ships,
                             profiles=cfg.profiles, swath=parse_swath_grid(cfg.swath_grid),
                             missing=cfg.station_missing, suspect=cfg.station_suspect, overwrite=cfg.overwrite)
    figures = result.figures()
    ctx.tracker.log_metrics({"n_obs": figures["n_obs"], "seconds": figures["seconds"],
                             **{f"n_obs_{k}": v["n_obs"] for k, v in figures["streams"].items()}})
    return figures


def prepare_obs_main(cfg: PrepareObsConfig, ctx: JobContext) -> dict[str, Any]:
    t0 = time.perf_counter()
    result = prepare_obs(cfg.source, cfg.out, cfg.stream, variables=cfg.variables, step_hours=cfg.step_hours,
                         noise=cfg.noise, description=cfg.description, overwrite=cfg.overwrite,
                         bounds=cfg.bounds)
    figures = {**result.figures(), "seconds": round(time.perf_counter() - t0, 2)}
    ctx.tracker.log_metrics({"n_obs": result.n_obs, "n_stations": result.n_stations,
                             "max_per_step": result.stream.max_per_step, "seconds": figures["seconds"]})
    return figures
