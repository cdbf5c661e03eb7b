"""Where outputs go and how they are written: the wxray home, output-location checks, atomic writes
(outputs appear complete under their final name or not at all)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import tempfile
import time
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


def relocated(path: str | os.PathLike) -> Path | None:
    """Where a path recorded by a run made in another folder is now: when the recorded absolute path is gone,
    the longest tail of it that exists under the wxray home (a project folder copied or moved whole: its
    runs/ recorded /old/project/data/x.zarr, now <home>/data/x.zarr). None when nothing is found."""
    p = Path(path).expanduser()
    if not p.is_absolute() or p.exists():
        return None
    parts = p.parts[1:]
    for k in range(len(parts), 0, -1):
        candidate = home() / Path(*parts[-k:])
        if candidate.exists():
            return candidate
    return None


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
            _remove_settled(tmp)


def _remove_settled(tmp: Path, quiet_s: float = 0.4, limit_s: float = 10.0) -> None:
    """Remove a failed output until it stays gone: a zarr write that failed on one chunk (a full disk) still
    has writes of other chunks in flight on zarr's event loop, which recreate their folders meanwhile."""
    deadline = time.monotonic() + limit_s
    _remove(tmp)
    gone_since = time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - gone_since < quiet_s:
        time.sleep(0.1)
        if tmp.exists() or tmp.is_symlink():
            _remove(tmp)
            gone_since = time.monotonic()


def write_json(path: str | os.PathLike, obj: Any) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
    return Path(path)


def write_text(path: str | os.PathLike, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def check_run_name(name: str) -> None:
    """A run name names a run; it is never a path (jobs put it in folder names: runs/train_e2e/<run_name>)."""
    if not name:
        return
    bad = next((c for c in name if c in "/\\" or ord(c) < 32), None)
    if bad is not None or name in (".", ".."):
        what = f"the character {bad!r}" if bad is not None else f"'{name}'"
        raise ConfigError(f"config key 'run_name': a name, not a path: '{name}' holds {what}")


def _within(inner: Path, outer: Path) -> bool:
    return inner == outer or outer in inner.parents


def check_apart(outputs: dict[str, tuple[str, bool]], inputs: dict[str, tuple[str, bool]]) -> None:
    """ConfigError unless every local output lies apart from every local input: an output equal to an input
    or inside one (unless that input holds runs) would be replaced while it is read, whatever `overwrite`
    says; an input inside an output that is not a run directory (a store, an obs dir) would be replaced too.

    `outputs` and `inputs` map config key -> (path, flag): for outputs the flag says "a run directory", for
    inputs "holds runs"."""
    for okey, (out, run_dir) in outputs.items():
        o = Path(out).resolve()
        for ikey, (inp, holds_runs) in inputs.items():
            i = Path(inp).resolve()
            if o == i:
                raise ConfigError(f"config key '{okey}': {out} is also the input '{ikey}'; write somewhere else")
            if _within(o, i) and not holds_runs:
                raise ConfigError(f"config key '{okey}': {out} lies inside the input '{ikey}' ({inp}); "
                                  f"write somewhere else")
            if _within(i, o) and not run_dir:
                raise ConfigError(f"config key '{okey}': {out} holds the input '{ikey}' ({inp}) and would replace "
                                  f"it; write somewhere else")


RUN_MARKERS = ("config.yaml", ".mlflow_run_id")
RUN_LOCK = ".wxray.lock"  # held in a run directory by the job that owns it, for as long as it runs


def check_run_dir(path: str | os.PathLike, reuse: bool) -> None:
    """ConfigError unless `path` is absent, empty, a wxray run directory (a re-run continues it), or `reuse`:
    a job adds and rolls back files in its run directory, which must not be somebody else's folder."""
    p = Path(path)
    holder = held_by(p / RUN_LOCK)
    if holder:  # before anything else: a job starting there now has no config.yaml yet
        raise ConfigError(f"config key 'out_dir': {p} is in use by another wxray job ({holder}); wait for it to "
                          "finish or choose another out_dir")
    if reuse or not p.is_dir() or any(p.joinpath(m).is_file() for m in RUN_MARKERS):
        return
    if any(e.name != RUN_LOCK for e in p.iterdir()):
        where = f"{p} (a link to {p.resolve()})" if p.is_symlink() else str(p)
        raise ConfigError(f"config key 'out_dir': {where} is a folder with files and not a wxray run directory "
                          f"(no config.yaml); choose an empty or new folder, or set out_dir_reuse=true")


class Busy(Exception):
    """The lock is held by another process (`lock(..., wait=False)`)."""

    def __init__(self, holder: str):
        super().__init__(holder)
        self.holder = holder


def held_by(path: str | os.PathLike) -> str | None:
    """Who holds the lock file `path` ("pid N on host"), or None when nobody does; changes nothing."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.read(fd, 200).decode(errors="replace").strip() or "another process"
    finally:
        os.close(fd)  # closing releases a lock taken here
    return None


@contextlib.contextmanager
def lock(path: str | os.PathLike, wait: bool = True) -> Iterator[None]:
    """Hold an exclusive lock on the file `path` (created, and removed on release) for the block.

    `flock`, so a process that dies releases it. The file records the holder's pid and host. After locking,
    the file must still be the one at `path` (a releasing holder may have removed it meanwhile): else lock
    the new one. `wait=False` raises `Busy` naming the holder instead of waiting."""
    path = Path(path)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            holder = os.read(fd, 200).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise Busy(holder) from None
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {os.uname().nodename}\n".encode())
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        os.close(fd)
