"""MLflow tracking: one small wrapper so jobs and the trainer log the same way (or not at all).

Experiments are created as model-training ones (tag `mlflow.experimentKind`), so MLflow 3's UI opens
them on the runs table rather than its GenAI overview. MLflow params are immutable: a resumed run that
changed a key records the new value as the tag `resumed_with.<key>` (and the run's config.yaml
artifact), so MLflow never contradicts the run directory.
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wxray.errors import ConfigError
from wxray.io import resolve_path

DEFAULT_DB = "runs/mlflow.db"
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}


@dataclass
class TrackingConfig:
    uri: str = ""  # "" -> $MLFLOW_TRACKING_URI, else sqlite:///<wxray home>/runs/mlflow.db
    experiment: str = ""  # "" -> the job's own experiment (wxray-train, wxray-evaluate, wxray-data, ...)
    enabled: bool = True  # false: log nothing to MLflow (summary.json and RESULT are still written)


def resolve_uri(uri: str = "") -> str:
    """An absolute tracking URI: relative sqlite paths resolve against the wxray home (`wxray.io.home`)."""
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI", "")
    if not uri:
        return f"sqlite:///{resolve_path(DEFAULT_DB)}"
    if uri.startswith("sqlite:///"):
        return f"sqlite:///{resolve_path(uri[len('sqlite:///'):])}"
    if "://" not in uri:
        raise ConfigError(f"config key 'tracking.uri' expects sqlite:///<file> or a server URL "
                          f"(MLflow 3 refuses the plain file store), got {uri!r}")
    return uri


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
        if self.uri.startswith("sqlite:///"):
            Path(self.uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
        before = os.environ.get("MLFLOW_TRACKING_URI")
        mlflow.set_tracking_uri(self.uri)
        # MLflow exports the URI to the environment; a later job of this process (a test session, Tune
        # trials) would then take it for the user's own setting. Workers get the URI explicitly instead.
        if before is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = before
        experiment = mlflow.get_experiment_by_name(cfg.experiment)
        if experiment is None:
            location = None
            if self.uri.startswith("sqlite:///"):
                # Without this MLflow puts artifacts in ./mlruns of whatever directory the job ran from.
                location = (Path(self.uri[len("sqlite:///"):]).parent / "mlartifacts").resolve().as_uri()
            mlflow.create_experiment(cfg.experiment, artifact_location=location, tags=EXPERIMENT_KIND)
        elif "mlflow.experimentKind" not in experiment.tags:
            mlflow.MlflowClient().set_experiment_tag(experiment.experiment_id, *next(iter(EXPERIMENT_KIND.items())))
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

    def log_params(self, params: dict[str, Any]) -> dict[str, str]:
        """Log params; for a continued run, return {key: new value} of those that changed (tagged)."""
        if not self.enabled:
            return {}
        data = self._mlflow.get_run(self.run_id).data
        existing, tags = data.params, data.tags
        values = {k: str(v)[:6000] for k, v in params.items()}
        fresh = {k: v for k, v in values.items() if k not in existing}
        if fresh:
            self._mlflow.log_params(fresh)
        changed = {k: v for k, v in values.items() if k in existing and existing[k] != v}
        if changed:
            self._mlflow.set_tags({f"resumed_with.{k}": v for k, v in changed.items()})
        for k in values:  # changed back to the first value: the tag would now contradict it
            if k not in changed and f"resumed_with.{k}" in tags:
                self._mlflow.delete_tag(f"resumed_with.{k}")
        return changed

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
