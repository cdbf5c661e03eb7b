"""Typed configs of the data jobs (`jobs/prepare_data.py`, `jobs/make_sample_data.py`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from wxray.errors import ConfigError
from wxray.job import JobConfig


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

    source: str = ""  # a GRIB / NetCDF file, a glob of them, or a zarr store
    out: str = ""  # the store to write (zarr v3 directory)
    variables: list[str] = field(default_factory=list)  # long or short names; [] = every gridded variable
    levels: list[int] = field(default_factory=list)  # hPa; [] = every level in the source
    member: int | Literal["mean"] | None = None  # ensemble sources: a member number or the ensemble mean
    allow_missing: bool = False  # keep NaN / missing values (masked) instead of rejecting the source
    clim_window_days: int = 15  # half width of the day-of-year window of the climatology
    overwrite: bool = False  # replace an existing store at `out`

    def validate(self) -> None:
        if not self.source:
            raise ConfigError("config key 'source' is required (a GRIB/NetCDF file, a glob or a zarr store)")
        if not self.out:
            raise ConfigError("config key 'out' is required (the zarr store to write)")
        if isinstance(self.member, int) and self.member < 0:
            raise ConfigError(f"config key 'member' expects a member number >= 0 or 'mean', "
                              f"got {self.member}")
        if not 0 <= self.clim_window_days <= 183:
            raise ConfigError(f"config key 'clim_window_days' expects 0..183, got {self.clim_window_days}")


@dataclass
class SampleDataConfig(JobConfig):
    """`jobs/make_sample_data.py out=<store> grid=32x64 days=<n> seed=<s> trajectories=<k>`"""

    out: str = "data/sample_32x64.zarr"  # the default store of the training job
    grid: str = "32x64"  # n_lat x n_lon of the equiangular grid (poles included)
    days: int = 25  # days kept per trajectory (4 steps a day)
    seed: int = 0
    trajectories: int = 4
    spinup_days: int = 5  # integrated and discarded before each trajectory's first kept step
    clim_window_days: int = 15
    overwrite: bool = False

    def validate(self) -> None:
        parse_grid(self.grid)
        if self.days < 1 or self.trajectories < 1 or self.spinup_days < 0:
            raise ConfigError("config keys 'days' and 'trajectories' must be >= 1 and 'spinup_days' >= 0")
        if self.days * self.trajectories * 4 < 2:
            raise ConfigError("the sample needs at least 2 time steps")
        if not 0 <= self.clim_window_days <= 183:
            raise ConfigError(f"config key 'clim_window_days' expects 0..183, got {self.clim_window_days}")
