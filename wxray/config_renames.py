"""Renamed config keys: `JobConfig.renamed` ({old: new}, new may be dotted: 'members.M') lists a job's old
names; for one release the old name still works, moved to the new one with one deprecation line, and giving
both is an error (`renamed`, called for every config class as it is built). A run's own saved config.yaml,
written before a rename, is read under its old names without a notice (`reading_saved`)."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

from wxray.errors import ConfigError

_saved = contextvars.ContextVar("wxray_reading_saved_config", default=False)


@contextlib.contextmanager
def reading_saved() -> Iterator[None]:
    token = _saved.set(True)
    try:
        yield
    finally:
        _saved.reset(token)


def deprecated(old: str, new: str) -> None:
    """The one line a renamed config key prints while its old name still works (for one release)."""
    if not _saved.get():
        print(f"wxray: config key '{old}' is deprecated and will be removed: use '{new}'", flush=True)


def renamed(cls: type, values: dict[str, Any], prefix: str) -> dict[str, Any]:
    """`values` (one level of a config, keys under `prefix`) with the old names of `cls.renamed` moved to the
    new ones."""
    values = dict(values)
    for old, new in getattr(cls, "renamed", {}).items():
        if old not in values:
            continue
        head, _, rest = new.partition(".")
        if head in values and (not rest or rest in (values[head] or {})):
            raise ConfigError(f"config keys '{prefix}{old}' and '{prefix}{new}' are one key ('{old}' is its old "
                              f"name): give '{prefix}{new}' only")
        deprecated(prefix + old, prefix + new)
        value = values.pop(old)
        values[head] = {**(values.get(head) or {}), rest: value} if rest else value
    return values
