#!/usr/bin/env python
"""Forecast with a trained checkpoint: forecast.zarr (forecast convention) + per-lead scores, RESULT line.

    python jobs/forecast.py checkpoint=runs/train_sparse/exp1                      # the run's test split
    python jobs/forecast.py checkpoint=<run or checkpoint dir> inits=2000-03-01/2000-03-31 steps=8
    python jobs/forecast.py checkpoint=<dir> members=10 seed=0           # routing draws as an ensemble
    python jobs/forecast.py checkpoint=<dir> members=50 workers.actors=8 workers.num_gpus=1   # on 8 GPU actors
    python jobs/evaluate.py forecast=<out_dir>/forecast.zarr truth=<store>   # CRPS, spread-skill, ...

Every option is a field of `wxray.forecast.job.ForecastConfig`; bad input exits 2 with a one-line error.
"""

from __future__ import annotations

import sys

from wxray.forecast.job import ForecastConfig
from wxray.job import run_job
from wxray.platform.ensemble.forecast import forecast_job


def main(argv: list[str] | None = None) -> int:
    return run_job("forecast", ForecastConfig, forecast_job, argv, doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
