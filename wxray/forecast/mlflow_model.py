"""A training run's final checkpoint (or an uplifted end-to-end stages folder) as an MLflow model in the model
registry, and back.

`log_model` logs the checkpoint that ends a training run as an MLflow model of flavor `wxray` (this module is
the flavor: MLflow calls its `save_model`) and registers it as the next version of `registered_model`:

    model/
      MLmodel          flavor wxray (checkpoint folder, model name, wxray version) and the signature:
                       inputs `x` (batch, history x channels + constants, lat, lon) float32, normalised,
                       outputs `next_state` (batch, targets, lat, lon): one step of the forecaster
      checkpoint/      state.pt (weights) and meta.json (model identity, data config, normalisation)
      config.yaml      the training run's resolved config

An uplifted end-to-end system (`jobs/finetune_stochastic.py`, once both the stochastic encoder and processor
exist) is logged likewise with `stages/` in place of `checkpoint/`: each stage's config.yaml and newest
checkpoint (the last lead of the processor), what the ensemble jobs read, registered as `wxray-e2e`.

`fetch_model("models:/<name>/<version>")` (or `models:/<name>@<alias>`, or `runs:/<run id>/model`) downloads
it from the registry of the tracking store and returns the checkpoint folder, which every job that takes a
checkpoint reads as it reads one on disk (`jobs/forecast.py checkpoint=models:/wxray-reslim/3`); for a stages
model its stages folder (`jobs/ensemble.py stages=models:/wxray-e2e/2`).
"""

from __future__ import annotations

import contextlib
import io
import shutil
import sys
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from wxray import __version__
from wxray.config import MODEL_URIS
from wxray.data import location
from wxray.errors import CheckpointError
from wxray.forecast import checkpoints
from wxray.tracking import redact_uri

FLAVOR = "wxray"
NAME = "model"  # the artifact folder of the logged model
CHECKPOINT, STAGES = "checkpoint", "stages"
STAGE_NAMES = ("chain", "encoder", "processor", "decoder", "stochastic_encoder", "stochastic_processor")


def is_model_uri(path: str) -> bool:
    return str(path).startswith(MODEL_URIS)


def signature(example: dict[str, np.ndarray]):
    """The model's signature from one training window (`x` in, `y` out)."""
    from mlflow.models import ModelSignature
    from mlflow.types import Schema, TensorSpec

    x, y = np.asarray(example["x"]), np.asarray(example["y"])
    return ModelSignature(inputs=Schema([TensorSpec(np.dtype(np.float32), (-1, *x.shape[1:]), "x")]),
                          outputs=Schema([TensorSpec(np.dtype(np.float32), (-1, *y.shape[1:]), "next_state")]))


def save_model(path: str | Path, mlflow_model, checkpoint: str | Path | None = None, stages: str | Path | None = None,
               config: str = "", model_name: str = "", signature=None) -> None:
    """The flavor's writer (MLflow's `Model.log` calls it): the folder of the module docstring at `path`."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if checkpoint is not None:
        shutil.copytree(checkpoint, path / CHECKPOINT)
    if stages is not None:
        snapshot_stages(Path(stages), path / STAGES)
    if config:
        (path / "config.yaml").write_text(config)
    if signature is not None:
        mlflow_model.signature = signature
    part = {"checkpoint": CHECKPOINT} if checkpoint is not None else {"stages": STAGES}
    mlflow_model.add_flavor(FLAVOR, **part, model=model_name, wxray_version=__version__)
    mlflow_model.save(str(path / "MLmodel"))


def snapshot_stages(stages: str | Path, dest: Path) -> None:
    """What the ensemble jobs read of a stages folder (on disk or at a URL): each stage's config.yaml and newest
    checkpoint (of the stochastic processor, its last lead), at the same relative paths under `dest`."""
    root = location.spelled(stages)
    for name in STAGE_NAMES:
        run = location.join(root, name)
        config = location.join(run, "config.yaml")
        if not location.exists(config):
            continue
        leads = sorted(location.glob(run, "lead_*"), key=lambda p: int(p.rstrip("/").rsplit("_", 1)[1]))
        last = checkpoints.latest(location.join(leads[-1] if leads else run, "ray"))
        if last is None:
            continue
        location.get(config, dest / name / "config.yaml")
        # relative by path parts, not by the root's length in characters (`stages=.` spells no prefix)
        location.get(last, dest / PurePosixPath(str(last)).relative_to(root))


def log_model(tracker, registered_model: str, model_name: str, config: str, checkpoint: str | Path | None = None,
              stages: str | Path | None = None, example: dict[str, np.ndarray] | None = None) -> dict[str, Any]:
    """Log `checkpoint` (or `stages`) as the run's MLflow model and register it (`registered_model` "" = log
    only). Returns RESULT's `mlflow_model` block: the model's URI and, when registered, name, version and the
    `models:/` URI."""
    from mlflow.models import Model

    # MLflow prints "Successfully registered model ..." on stderr: the job says it in its own line instead
    with contextlib.redirect_stderr(io.StringIO()):
        info = Model.log(None, name=NAME, flavor=_flavor(), run_id=tracker.run_id,
                         registered_model_name=registered_model or None, await_registration_for=0,
                         checkpoint=None if checkpoint is None else str(checkpoint),
                         stages=None if stages is None else str(stages), config=config, model_name=model_name,
                         signature=None if example is None else signature(example))
    out: dict[str, Any] = {"model_uri": info.model_uri}
    if registered_model:
        version = info.registered_model_version
        out.update(name=registered_model, version=int(version), uri=f"models:/{registered_model}/{version}")
    return out


def _flavor():
    return sys.modules[__name__]  # this module is the flavor MLflow saves with


def fetch_model(uri: str, tracking_uri: str, part: str = CHECKPOINT) -> Path:
    """The checkpoint (or stages) folder of model `uri` from the registry of `tracking_uri`, downloaded once per
    process (`checkpoints.local_copy`); a one-line CheckpointError when it is not there."""
    import mlflow
    from mlflow.exceptions import MlflowException

    def download(local: Path) -> Path:
        try:
            source = _artifact_source(uri, tracking_uri)
            with contextlib.redirect_stderr(io.StringIO()):  # its progress bar
                return Path(mlflow.artifacts.download_artifacts(artifact_uri=source, dst_path=str(local),
                                                                tracking_uri=tracking_uri))
        except MlflowException as e:
            raise CheckpointError(f"checkpoint {uri}: not in the model registry of {redact_uri(tracking_uri)} "
                                  f"({str(e.message).splitlines()[0]})") from None

    found = checkpoints.local_copy(uri, download, prefix="wxray-model-") / part
    if not found.is_dir():
        kind = "a training run's checkpoint" if part == CHECKPOINT else "an end-to-end stages folder"
        raise CheckpointError(f"checkpoint {uri}: not a wxray model of {kind} (no {part}/ in it)")
    return found


def _artifact_source(uri: str, tracking_uri: str) -> str:
    """Where the artifacts of `uri` are: a registered version (models:/<name>/<version>, models:/<name>@<alias>)
    looked up in the registry of `tracking_uri` itself (not MLflow's process-wide registry URI); runs:/ as is."""
    import mlflow

    if not uri.startswith("models:/"):
        return uri
    name, sep, rest = uri[len("models:/"):].partition("@")
    client = mlflow.MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    if sep:
        version = client.get_model_version_by_alias(name, rest)
    else:
        name, _, number = name.rpartition("/")
        version = client.get_model_version(name, number)
    return client.get_model_version_download_uri(version.name, version.version)


def local_stages(stages: str, tracking_uri: str) -> Path:
    """The stages folder `stages=` names: itself, a stages model's from the registry, or for a folder at a URL
    (a stages folder copied to a bucket) its stages' configs and newest checkpoints, fetched once per process."""
    if is_model_uri(stages):
        return fetch_model(stages, tracking_uri, STAGES)
    if not location.is_remote(stages):
        return Path(stages)
    url = location.spelled(stages)

    def copy(local: Path) -> Path:
        if not location.reachable(url, "stages"):
            raise CheckpointError(f"stages {url}: not found (expected the stages folder of jobs/train_e2e.py)")
        snapshot_stages(url, local / STAGES)
        if not (local / STAGES).is_dir():
            raise CheckpointError(f"stages {url}: no stage with a checkpoint in it (expected the stages folder "
                                  "of jobs/train_e2e.py: <stage>/config.yaml and <stage>/ray/.../checkpoint_*)")
        return local / STAGES

    return checkpoints.local_copy(url, copy, prefix="wxray-stages-")
