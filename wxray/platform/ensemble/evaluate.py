"""jobs/evaluate.py: the evaluate job of the Ray-free verify room (`wxray.verify.evaluate`), its blocks of inits
scored on Ray tasks across the cluster, `ray_tasks` at a time, when ray_tasks > 0 (`replicas.TaskMap`; the
scorecard is the same, to the bit, as with one process); on `workers` processes here when it is 0."""

from __future__ import annotations

from typing import Any

from wxray.job import JobContext
from wxray.platform.cluster.replicas import TaskMap
from wxray.platform.cluster.session import ensure_ray
from wxray.verify.evaluate import EvaluateConfig, evaluate


def evaluate_job(cfg: EvaluateConfig, ctx: JobContext) -> dict[str, Any]:
    if cfg.ray_tasks == 0:
        return evaluate(cfg, ctx)
    ensure_ray(cfg.ray_address)
    return evaluate(cfg, ctx, map_blocks=TaskMap(cfg.ray_tasks))
