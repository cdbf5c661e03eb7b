"""One reporting function for the training loop: MLflow from rank 0, and Ray Train/Tune from every rank.

`Reporter.log` is cheap per-step logging (MLflow only). `Reporter.report` is the per-epoch report: it
is a barrier across workers (`ray.train.report`), carries the checkpoint, and is what a Ray Tune driver
sees; the same metrics go to MLflow so sweeps and single runs read alike.
"""

from __future__ import annotations

import math
import time
import warnings
from typing import Any


class Reporter:
    def __init__(self, rank: int, tracking_uri: str = "", run_id: str = "", use_ray: bool = True):
        self.rank = rank
        self.use_ray = use_ray
        self._client = None
        self._run_id = run_id
        if rank == 0 and tracking_uri and run_id:
            import logging

            from mlflow.tracking import MlflowClient

            logging.getLogger("mlflow").setLevel(logging.WARNING)
            self._client = MlflowClient(tracking_uri=tracking_uri)

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self._client is None:
            return

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, step) for k, v in metrics.items()
                 if isinstance(v, (int, float)) and math.isfinite(float(v))]
        if batch:
            try:
                self._client.log_batch(self._run_id, metrics=batch)
            except Exception as e:  # a tracking hiccup (locked sqlite, server restart) must not kill training
                warnings.warn(f"MLflow logging failed at step {step}: {type(e).__name__}: {e}", stacklevel=2)

    def report(self, metrics: dict[str, Any], step: int, checkpoint=None) -> None:
        self.log(metrics, step)
        if self.use_ray:
            import ray.train

            ray.train.report(metrics, checkpoint=checkpoint)
