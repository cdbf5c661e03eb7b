"""Where a training run keeps what outlives its processes: Ray Train's checkpoints and a copy of the run.

    train.storage=""                  -> <out_dir>/ray                       (a folder every node sees)
    train.storage=s3://bucket/runs    -> s3://bucket/runs/<job>/<run>/ray    (object storage, no shared disk)
    train.storage=/lustre/wxray       -> /lustre/wxray/<job>/<run>/ray       (a shared file system)

With `storage` set, the run's folder `<storage>/<key>` mirrors its run directory. Ray Train writes the
checkpoints under `ray/` from every worker; for a URL through a pyarrow filesystem wrapping wxray's own
(`location.arrow_filesystem`: the same endpoint, credentials and retries as the reads). The driver copies
`.mlflow_run_id` there as soon as the MLflow run is open, and the run directory's other files when the job
ends. The key is the run directory's path under `<wxray home>/runs` (`train_sparse/exp1`), else its absolute
path: a re-run with the same run name on any machine resumes from there (and continues its MLflow run), and
`checkpoint=<storage>/<key>` forecasts from it.

The invariant: `ray_location(storage, out_dir)` is the one place both the Ray Train run and every reader of
its checkpoints (`check_resume`, `checkpoints.latest`) look.
"""

from __future__ import annotations

from pathlib import Path

from wxray.data import location
from wxray.errors import ConfigError
from wxray.io import home


def check(storage: str) -> None:
    """A `train.storage` URL whose bucket is not there (or cannot be reached) is one line before any work."""
    if not location.is_remote(storage):
        return
    bucket = storage.split("://", 1)[1].split("/", 1)[0]
    root = f"{location.scheme(storage)}://{bucket}"
    if not location.reachable(root, "train.storage"):
        raise ConfigError(f"config key 'train.storage' is {storage}: bucket {root} does not exist")


def run_key(out_dir: str | Path) -> str:
    """The run directory's path under `<home>/runs`, else its absolute path (a bare name could be another
    run's: two `out_dir=/scratch/<a>/exp` runs must not resume from each other)."""
    out = Path(out_dir).resolve()
    try:
        return out.relative_to(home() / "runs").as_posix()
    except ValueError:
        return out.as_posix().lstrip("/")


def run_location(storage: str, out_dir: str | Path) -> str:
    """The run's folder: `out_dir` itself, or `<storage>/<run key>`."""
    if not storage:
        return str(Path(out_dir).resolve())
    return location.join(storage, run_key(out_dir))


def ray_location(storage: str, out_dir: str | Path) -> str:
    """Ray Train's storage path of the run (its checkpoints are under `<this>/train/`)."""
    return location.join(run_location(storage, out_dir), "ray")


def ray_storage(storage: str, out_dir: str | Path) -> tuple[str, object | None]:
    """(storage_path, storage_filesystem) for Ray Train's RunConfig."""
    fs, path = location.arrow_filesystem(ray_location(storage, out_dir))
    return path, fs


def checkpoint_url(storage: str, path: str) -> str:
    """A Ray Train checkpoint's path (inside the storage filesystem) as a location a user can pass back."""
    if location.is_remote(storage):
        return f"{location.scheme(storage)}://{path.lstrip('/')}"
    return str(Path(path).resolve())
