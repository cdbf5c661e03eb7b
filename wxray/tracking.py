"""MLflow tracking: one small wrapper so jobs and the trainer log the same way (or not at all)."""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_DB = "runs/mlflow.db"


@dataclass
class TrackingConfig:
    uri: str = ""  # "" -> $MLFLOW_TRACKING_URI, else sqlite:///<cwd>/runs/mlflow.db
    experiment: str = "wxray"
    enabled: bool = True


def resolve_uri(uri: str = "") -> str:
    if uri:
        return uri
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    db = Path.cwd() / DEFAULT_DB
    db.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{db}"


class Tracker:
    """A started MLflow run, or a no-op when tracking is disabled."""

    def __init__(self, cfg: TrackingConfig, run_name: str, tags: dict[str, str] | None = None,
                 run_id: str | None = None):
        self.enabled = cfg.enabled
        self.run_id: str | None = None
        self.uri = resolve_uri(cfg.uri) if cfg.enabled else ""
        if not self.enabled:
            return
        import logging

        import mlflow

        # Alembic migrations of a fresh sqlite store are chatty at INFO.
        for name in ("alembic", "mlflow"):
            logging.getLogger(name).setLevel(logging.WARNING)
        mlflow.set_tracking_uri(self.uri)
        if self.uri.startswith("sqlite:///") and mlflow.get_experiment_by_name(cfg.experiment) is None:
            # Without this MLflow puts artifacts in ./mlruns of whatever directory the job ran from.
            artifacts = Path(self.uri[len("sqlite:///"):]).parent / "mlartifacts"
            mlflow.create_experiment(cfg.experiment, artifact_location=artifacts.resolve().as_uri())
        mlflow.set_experiment(cfg.experiment)
        try:
            run = mlflow.start_run(run_id=run_id, run_name=None if run_id else run_name, tags=tags or {})
        except Exception as e:
            if run_id is None:
                raise
            # The run to continue is gone (deleted, or another tracking store): log to a fresh one.
            warnings.warn(f"cannot continue MLflow run {run_id} ({type(e).__name__}); starting a new run",
                          stacklevel=2)
            run = mlflow.start_run(run_name=run_name, tags=tags or {})
        self.run_id = run.info.run_id
        self._mlflow = mlflow

    def log_params(self, params: dict[str, Any]) -> None:
        if self.enabled:
            # MLflow params are immutable; a resumed run re-logs the same values, others are dropped.
            existing = self._mlflow.get_run(self.run_id).data.params
            fresh = {k: str(v)[:6000] for k, v in params.items() if k not in existing}
            if fresh:
                self._mlflow.log_params(fresh)

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if self.enabled:
            clean = {k.replace("@", "_"): float(v) for k, v in metrics.items()
                     if isinstance(v, (int, float)) and math.isfinite(float(v))}
            if clean:
                self._mlflow.log_metrics(clean, step=step)

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        if self.enabled and Path(path).exists():
            if Path(path).is_dir():
                self._mlflow.log_artifacts(str(path), artifact_path=artifact_path)
            else:
                self._mlflow.log_artifact(str(path), artifact_path=artifact_path)

    def set_tags(self, tags: dict[str, str]) -> None:
        if self.enabled:
            self._mlflow.set_tags(tags)

    def end(self, status: str = "FINISHED") -> None:
        if self.enabled and self._mlflow.active_run() is not None:
            self._mlflow.end_run(status=status)
