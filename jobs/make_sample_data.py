"""Generate the embedded shallow-water sample store (torch-harmonics ShallowWaterSolver; NOT ERA5).

    python jobs/make_sample_data.py out=data/sample_32x64.zarr grid=32x64 days=25 seed=0 trajectories=4

`days` are kept per trajectory (4 steps a day, 6-hourly); each trajectory starts from its own random
balanced state (seeded) after a discarded spin-up. Writes the store with its `stats/*` groups atomically
and prints `RESULT {json}` (store, n_times, grid, trajectories, generation seconds).
See wxray/data/sample.py.
"""

from __future__ import annotations

import sys

from wxray.data.jobs_config import SampleDataConfig, parse_grid
from wxray.data.sample import make_sample_store
from wxray.job import JobContext, run_job


def main(cfg: SampleDataConfig, ctx: JobContext) -> dict:
    result = make_sample_store(cfg.out, grid=parse_grid(cfg.grid), days=cfg.days, seed=cfg.seed,
                               trajectories=cfg.trajectories, spinup_days=cfg.spinup_days,
                               clim_window_days=cfg.clim_window_days, overwrite=cfg.overwrite)
    ctx.tracker.log_metrics({"n_times": result.n_times, "generate_seconds": result.seconds})
    return result.figures()


if __name__ == "__main__":
    sys.exit(run_job("make_sample_data", SampleDataConfig, main))
