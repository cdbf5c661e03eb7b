"""MLflow tracking: one small wrapper so jobs and the trainer log the same way (or not at all).

Experiments are created as model-training ones (tag `mlflow.experimentKind`) with a shared view of the runs
table (`tracking_view`: the links wxray prints open MLflow 3's UI on that table, not its GenAI overview).
MLflow params are immutable: a resumed run that changed a key records the new value as the tag
`resumed_with.<key>` (and the run's config.yaml artifact), so MLflow never contradicts the run directory.

A tracking server (`tracking.uri=http(s)://...`) is probed before the job does anything (`check_server`): one
that does not answer within a few seconds is a one-line error, or with `tracking.required=false` a warning
and the local sqlite store instead. Credentials never reach MLflow params or the run's config.yaml
(`redact`): values of keys named like password/token/secret and the password of a URL are replaced by ***.
"""

from __future__ import annotations

import http.client
import math
import os
import re
import sqlite3
import ssl
import urllib.error
import urllib.request
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import unquote, urlparse

from wxray import tracking_view as view
from wxray.errors import ConfigError
from wxray.io import resolve_path

DEFAULT_DB = "runs/mlflow.db"
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}


@dataclass
class TrackingConfig:
    uri: str = ""  # "" -> $MLFLOW_TRACKING_URI, else sqlite:///<wxray home>/runs/mlflow.db
    experiment: str = ""  # "" -> the job's own experiment (wxray-train, wxray-evaluate, wxray-data, ...)
    enabled: bool = True  # false: log nothing to MLflow (summary.json and RESULT are still written)
    # a tracking server (http(s)://) that does not answer at job start: true = error before any work, false = a
    # warning and the local sqlite store under the wxray home instead (RESULT's tracking_fallback)
    required: bool = True
    fallback: ClassVar[str] = ""  # set by check_server: the local store used instead of a server that is down


def resolve_uri(uri: str = "") -> str:
    """An absolute tracking URI: relative sqlite paths resolve against the wxray home (`wxray.io.home`)."""
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI", "")
    if not uri:
        return local_uri()
    if uri.startswith("sqlite:///"):
        return f"sqlite:///{resolve_path(uri[len('sqlite:///'):])}"
    if "://" not in uri:
        raise ConfigError(f"config key 'tracking.uri' expects sqlite:///<file> or a server URL "
                          f"(MLflow 3 refuses the plain file store), got {uri!r}")
    return uri


def local_uri() -> str:
    """The local sqlite store under the wxray home (the default, and the fallback for a server that is down)."""
    return f"sqlite:///{resolve_path(DEFAULT_DB)}"


PROBE_TIMEOUT_S = 5.0
# A key (split into words at . _ -) is a credential when a word is one of SECRET_WORDS, or it ends in a
# token (hf_token, access_token: not num_tokens, token_dim) or an api/private/secret key.
SECRET_WORDS = {"password", "passwd", "passphrase", "secret", "credential", "credentials", "apikey"}
SECRET_ENDINGS = ("token", "api_key", "access_key", "private_key", "secret_key")
REDACTED = "***"
_URL_PASSWORD = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://[^/@:\s]*):[^/@\s]*@")


def redact_uri(text: str) -> str:
    """`text` with the password of any URL in it (scheme://user:password@host) replaced by ***."""
    return _URL_PASSWORD.sub(rf"\1:{REDACTED}@", text)


def is_secret(key: str) -> bool:
    words = re.split(r"[._\-]", key.lower())
    return bool(SECRET_WORDS & set(words)) or "_".join(words).endswith(SECRET_ENDINGS)


def redact(key: str, value: Any) -> Any:
    """The value to show of config key `key`: *** for a credential-looking key, URL passwords removed."""
    if is_secret(key) and value not in (None, ""):
        return REDACTED
    if isinstance(value, str):
        return redact_uri(value)
    if isinstance(value, dict):
        return {k: redact(k, v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(key, v) for v in value]
    return value


def probe_server(uri: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """None when the MLflow server at `uri` answers GET /health within `timeout_s` (any HTTP answer below 500:
    a server asking for credentials is up), else why not. One try: MLflow's own client retries for minutes."""
    context = None
    if uri.startswith("https://"):
        if os.environ.get("MLFLOW_TRACKING_INSECURE_TLS", "").lower() == "true":
            context = ssl._create_unverified_context()  # the user's own MLflow setting
        else:
            context = ssl.create_default_context(cafile=os.environ.get("MLFLOW_TRACKING_SERVER_CERT_PATH") or None)
    url = re.sub(r"//[^/@]*@", "//", uri.rstrip("/")) + "/health"  # credentials go in the header, not the URL
    try:
        with urllib.request.urlopen(url, timeout=timeout_s, context=context):
            return None
    except urllib.error.HTTPError as e:
        return None if e.code < 500 else f"it answered HTTP {e.code}"
    except (OSError, ValueError, http.client.HTTPException) as e:  # URLError is an OSError
        reason = getattr(e, "reason", e)
        return f"{type(reason).__name__}: {reason}" if not isinstance(reason, str) else reason


def check_server(cfg: TrackingConfig, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """Before any work: a tracking server that does not answer is a ConfigError naming it (tracking.required),
    or with tracking.required=false the local sqlite store instead (`cfg.uri`, `cfg.fallback`): then the
    warning to show is returned. None when the server answers (or there is none)."""
    if not cfg.enabled or not cfg.uri.startswith(("http://", "https://")):
        return None
    why = probe_server(cfg.uri, timeout_s)
    if why is None:
        return None
    shown = redact_uri(cfg.uri)
    if cfg.required:
        raise ConfigError(f"tracking server {shown} does not answer ({why}): start it (make mlflow-server), "
                          "fix tracking.uri / MLFLOW_TRACKING_URI, or set tracking.required=false to log to the "
                          "local sqlite store instead")
    cfg.uri = cfg.fallback = local_uri()
    return (f"tracking server {shown} does not answer ({why}); tracking.required=false: logging to the local "
            f"store {cfg.uri} instead")


ARTIFACTS = "mlartifacts"  # beside a sqlite store: the artifact root wxray gives its experiments


def follow_moved_store(db: Path, experiment) -> None:
    """A runs/ folder copied or moved whole keeps its sqlite store, whose experiments and runs name the artifact
    folder where they were made (MLflow stores it absolute): new runs would write their artifacts into the old
    place, old runs would read from it. When an experiment's artifact root is the `mlartifacts` of another
    folder, point it and its runs at the one beside this store (the folder travelled with the store)."""
    here = (db.parent / ARTIFACTS).resolve().as_uri()
    old = str(experiment.artifact_location)
    if old == here or not old.startswith("file://") or not old.rstrip("/").endswith("/" + ARTIFACTS):
        return
    if Path(unquote(urlparse(old).path)).resolve() == Path(unquote(urlparse(here).path)):
        return
    with sqlite3.connect(db) as con:
        con.execute("UPDATE experiments SET artifact_location = ? WHERE experiment_id = ?",
                    (here, int(experiment.experiment_id)))
        con.execute("UPDATE runs SET artifact_uri = ? || substr(artifact_uri, ?) WHERE experiment_id = ? "
                    "AND substr(artifact_uri, 1, ?) = ?",
                    (here, len(old) + 1, int(experiment.experiment_id), len(old), old))
    print(f"wxray: MLflow store {db} was made in another folder: experiment '{experiment.name}' now keeps its "
          f"artifacts beside it ({here}), not in {old}", flush=True)


class Tracker:
    """A started MLflow run, or a no-op when tracking is disabled."""

    def __init__(self, cfg: TrackingConfig, run_name: str, tags: dict[str, str] | None = None,
                 run_id: str | None = None, columns: tuple[str, ...] = ()):
        self.enabled = cfg.enabled
        self.columns = columns  # patterns of the metrics the UI's runs table shows (tracking_view)
        self.run_id: str | None = None
        self.uri = resolve_uri(cfg.uri) if cfg.enabled else ""
        if not self.enabled:
            return
        import logging

        import mlflow

        # Alembic migrations of a fresh sqlite store are chatty at INFO; MLflow's own "View run at" lines on
        # stdout would break the console's shape (the job prints the run's address itself: `run_url`).
        for name in ("alembic", "mlflow"):
            logging.getLogger(name).setLevel(logging.WARNING)
        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
        if self.uri.startswith("sqlite:///"):
            Path(self.uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
        before = os.environ.get("MLFLOW_TRACKING_URI")
        mlflow.set_tracking_uri(self.uri)
        # The registry follows the tracking URI unless the user set MLFLOW_REGISTRY_URI: never pinned here, as a
        # process-wide registry URI would also redirect every later MlflowClient(tracking_uri) of this process.
        # MLflow exports the URI to the environment; a later job of this process (a test session, Tune
        # trials) would then take it for the user's own setting. Workers get the URI explicitly instead.
        if before is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = before
        experiment = mlflow.get_experiment_by_name(cfg.experiment)
        defaults = {**EXPERIMENT_KIND, view.VIEW_TAG: view.view_state(None, [])}
        if experiment is None:
            location = None
            if self.uri.startswith("sqlite:///"):
                # Without this MLflow puts artifacts in ./mlruns of whatever directory the job ran from.
                location = (Path(self.uri[len("sqlite:///"):]).parent / ARTIFACTS).resolve().as_uri()
            mlflow.create_experiment(cfg.experiment, artifact_location=location, tags=defaults)
        else:  # an experiment made before wxray set these tags
            if self.uri.startswith("sqlite:///"):
                follow_moved_store(Path(self.uri[len("sqlite:///"):]), experiment)
            for key, value in defaults.items():
                if key not in experiment.tags:
                    mlflow.MlflowClient().set_experiment_tag(experiment.experiment_id, key, value)
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
        self._experiment_id = run.info.experiment_id
        self._mlflow = mlflow

    @property
    def experiment_id(self) -> str | None:
        return getattr(self, "_experiment_id", None)

    @property
    def run_url(self) -> str:
        """The run's page on a tracking server (credentials left out); "" for a local store."""
        if not (self.run_id and self.uri.startswith(("http://", "https://"))):
            return ""
        return view.run_url(redact_uri(self.uri), self._experiment_id, self.run_id)

    def log_params(self, params: dict[str, Any]) -> dict[str, str]:
        """Log params; for a continued run, return {key: new value} of those that changed (tagged)."""
        if not self.enabled:
            return {}
        data = self._mlflow.get_run(self.run_id).data
        existing, tags = data.params, data.tags
        values = {k: str(redact(k, v))[:6000] for k, v in params.items()}
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
            if status == "FINISHED":
                try:  # the UI's columns are a convenience: a server that refuses the tag fails no job
                    view.show_columns(self._mlflow.MlflowClient(), self._experiment_id, self.run_id, self.columns)
                except self._mlflow.exceptions.MlflowException as e:
                    warnings.warn(f"MLflow: the runs table's columns were not updated ({e.message})", stacklevel=2)
            self._mlflow.end_run(status=status)
