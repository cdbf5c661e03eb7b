"""MLflow sqlite stores for the tests: MLflow migrates a new sqlite file through every schema version (about 2 s
on 2 cores), so each test gets a copy of one store migrated once per process."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from mlflow.tracking import MlflowClient

_TEMPLATE: list[Path] = []


def _template() -> Path:
    if not _TEMPLATE:
        path = Path(tempfile.mkdtemp(prefix="wxray-mlflow-template-")) / "mlflow.db"
        MlflowClient(f"sqlite:///{path}").search_experiments()  # makes the tables
        _TEMPLATE.append(path)
    return _TEMPLATE[0]


def fresh_uri(folder: str | Path, name: str = "mlflow.db") -> str:
    """The URI of an empty, migrated MLflow store at `folder/name` (made there unless a store is already there)."""
    path = Path(folder) / name
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_template(), path)
    return f"sqlite:///{path}"
