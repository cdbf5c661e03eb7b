"""What a job prints for its user: one `say` line per step of progress, and whether `--verbose` asked for more
(Ray's own log output). Below every room, so that any of them can say what it does."""

from __future__ import annotations

import os

VERBOSE_ENV = "WXRAY_VERBOSE"  # set by `--verbose`; inherited by Ray's workers


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0")


def say(line: str) -> None:
    """A progress line for the user, on stdout, flushed (RESULT stays the last line)."""
    print(f"wxray: {line}", flush=True)
