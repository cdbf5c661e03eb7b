"""Refuse what cannot fit, from the shapes, before any work: the memory one piece of work needs and the disk
an output takes, against what this machine has (a job that would be OOM-killed again and again, or stop at
ENOSPC after an hour, is bad input).

Estimates are lower bounds from array shapes (float32 = 4 bytes); a refusal names the key to lower.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from wxray.errors import ConfigError


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"


def available_memory() -> int:
    """Bytes this machine can still give (MemAvailable; else physical memory)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def free_disk(path: str | os.PathLike) -> int:
    """Free bytes on the file system that holds `path` (or its nearest existing parent)."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free


def check_memory(need: float, what: str, keys: str, have: float | None = None) -> None:
    """ConfigError unless `need` bytes fit in `have` (default: this machine's available memory)."""
    have = available_memory() if have is None else have
    if need > have:
        raise ConfigError(f"{what} needs at least {human(need)} of memory, more than the {human(have)} available: "
                          f"lower {keys}")


def check_disk(need: float, path: str | os.PathLike, what: str, keys: str) -> None:
    """ConfigError unless `need` bytes fit on the file system of `path`."""
    have = free_disk(path)
    if need > have:
        raise ConfigError(f"{what} takes at least {human(need)} on disk, more than the {human(have)} free at {path}: "
                          f"lower {keys} or choose another out_dir")
