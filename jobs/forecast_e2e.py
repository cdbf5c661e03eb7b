"""Forecast from observations with a trained end-to-end chain: analysis, rollout, station forecasts.

    python jobs/forecast_e2e.py stages=runs/train_e2e/e2e steps=4
    python jobs/forecast_e2e.py stages=runs/train_e2e/e2e deny=[stations]     # observing-system denial
    python jobs/evaluate.py forecast=<out_dir>/forecast.zarr truth=data/sample_32x64.zarr \
        stations=<out_dir>/stations.parquet station_obs=data/sample_obs station_baseline=bilinear
"""

import sys

from wxray.forecast.job_e2e import ForecastE2EConfig, forecast_e2e
from wxray.job import run_job

if __name__ == "__main__":
    sys.exit(run_job("forecast_e2e", ForecastE2EConfig, forecast_e2e, doc=__doc__))
