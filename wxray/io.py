"""Where outputs go and how they are written: the wxray home, output-location checks, atomic writes
(outputs appear complete under their final name or not at all)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from wxray.errors import ConfigError

HOME_ENV = "WXRAY_HOME"
# Set by Ray's job supervisor in every submitted driver; its working directory is then a temporary copy.
SUBMISSION_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"


def under_job_submission() -> bool:
    return SUBMISSION_ENV in os.environ


def home() -> Path:
    """The root that relative paths (runs/, data/, the MLflow store) resolve against, absolute.

    $WXRAY_HOME when set; else the working directory -- except under `ray job submit`, whose working
    directory is a temporary copy that Ray deletes: there outputs go to ~/wxray rather than vanish.
    """
    env = os.environ.get(HOME_ENV, "")
    if env:
        return Path(env).expanduser().resolve()
    if under_job_submission():
        return (Path.home() / "wxray").resolve()
    return Path.cwd().resolve()


def resolve_path(path: str | os.PathLike) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else home() / p


def check_writable(path: str | os.PathLike, key: str, replace: bool = True) -> None:
    """ConfigError naming `key` unless the directory `path` can be created, or written and (`replace`)
    replaced by this user: `atomic_path` renames a sibling into place, so the parent must be writable too."""
    p = Path(path)
    if p.exists():
        if not p.is_dir():
            raise ConfigError(f"config key '{key}': {p} exists and is not a directory")
        for d in (p, p.parent) if replace else (p,):
            if not _can_create_in(d):
                raise ConfigError(f"config key '{key}': {d} is not writable")
        return
    parent = p.parent
    while not parent.exists():
        if parent.is_symlink():
            raise ConfigError(f"config key '{key}': {parent} is a broken link")
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"config key '{key}': cannot create {p}: {parent} is a file, not a directory")
    if not _can_create_in(parent):
        raise ConfigError(f"config key '{key}': cannot create {p}: {parent} is not writable")


def _can_create_in(directory: Path) -> bool:
    """Create and remove a probe file: os.access says yes to root even in an immutable folder."""
    if not os.access(directory, os.W_OK | os.X_OK):
        return False
    try:
        fd, probe = tempfile.mkstemp(prefix=".wxray-probe-", dir=directory)
    except OSError:
        return False
    os.close(fd)
    os.unlink(probe)
    return True


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink()


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, overwrite: bool = True) -> Iterator[Path]:
    """Yield a temporary sibling of `path`; on success rename it to `path`, on failure delete it.

    Works for files and directories (e.g. a zarr store). The temporary name starts with a dot so a
    half-written output is never mistaken for a real one.
    """
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        yield tmp
        if final.exists() and not (final.is_dir() or tmp.is_dir()):
            if not overwrite:
                raise FileExistsError(f"{final} already exists")
            os.replace(tmp, final)  # atomic for files: no moment without `final`
        elif final.exists():
            if not overwrite:
                raise FileExistsError(f"{final} already exists")
            old = final.with_name(f".{final.name}.old-{uuid.uuid4().hex[:8]}")
            os.replace(final, old)
            os.replace(tmp, final)
            _remove(old)
        else:
            os.replace(tmp, final)
    finally:
        if tmp.exists():
            _remove(tmp)


def write_json(path: str | os.PathLike, obj: Any) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
    return Path(path)


def write_text(path: str | os.PathLike, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)
