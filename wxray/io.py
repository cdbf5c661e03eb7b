"""Atomic writes: outputs appear complete under their final name or not at all."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any


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
