"""Convert an ERA5-style source (GRIB / NetCDF / zarr: a file, a glob or a store) into a wxray store.

    python jobs/prepare_data.py source=/path/era5.grib out=data/era5.zarr variables=[z,t] levels=[500,850]
    python jobs/prepare_data.py --config configs/prepare_data.yaml source=... out=... member=mean

Writes the zarr v3 store with its `stats/*` groups (atomically: a failure leaves no store) and prints
`RESULT {json}` with the variables, levels, number of times, grid, missing-value count and store path.
Bad input (corrupt file, missing variable/level, NaNs, bad time axis) -> one-line error, exit 2.
See wxray/data/convert.py for the conventions.
"""

from __future__ import annotations

import sys
import time

from wxray.data.convert import prepare_data
from wxray.data.jobs_config import PrepareDataConfig
from wxray.job import JobContext, run_job


def main(cfg: PrepareDataConfig, ctx: JobContext) -> dict:
    t0 = time.perf_counter()
    result = prepare_data(cfg)
    figures = {**result.figures(), "seconds": round(time.perf_counter() - t0, 2)}
    ctx.tracker.log_metrics({"n_times": result.n_times, "n_missing": result.n_missing,
                             "n_variables": len(result.variables), "seconds": figures["seconds"]})
    return figures


if __name__ == "__main__":
    sys.exit(run_job("prepare_data", PrepareDataConfig, main))
