"""jobs/forecast.py: the forecast job of the Ray-free room (`wxray.forecast.job`), its batches of (init, member)
samples on `workers.actors` Ray actors, each holding the model, all writing one forecast.zarr, when
workers.actors > 0 (`wxray.platform.cluster.replicas`); in the job's own process when it is 0."""

from __future__ import annotations

from typing import Any

from wxray.forecast.job import ForecastConfig, forecast
from wxray.job import JobContext
from wxray.platform.cluster.replicas import ReplicaRunner, check_fits
from wxray.platform.cluster.session import ensure_ray


def forecast_job(cfg: ForecastConfig, ctx: JobContext) -> dict[str, Any]:
    w = cfg.workers
    if w.actors == 0:
        return forecast(cfg, ctx)
    ensure_ray(cfg.ray_address, timeout_s=cfg.ray_timeout_s)
    check_fits(w.actors, w.num_cpus, w.num_gpus, w.vendor)  # before anything is written
    return forecast(cfg, ctx, runner=ReplicaRunner(w))
