"""A YAML config file read with one-line errors: a file that is missing, a directory, unreadable, not YAML, not
a mapping, or that gives a key twice (YAML itself would keep the last) is a `ConfigError` naming it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from wxray.errors import ConfigError


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (YAML itself would keep the last)."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise ConfigError(f"config file {self.name}: key '{key}' is given twice "
                                  f"(lines {seen[key]} and {line})")
            seen[key] = line
        return super().construct_mapping(node, deep)


def load_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"config file {p} is a directory, not a YAML file")
    if not p.is_file():
        raise ConfigError(f"config file {p} does not exist")
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"config file {p} cannot be read ({type(e).__name__})") from None
    loader = _UniqueKeyLoader(text)
    loader.name = str(p)
    try:
        data = loader.get_single_data() or {}
    except yaml.YAMLError as e:
        line = getattr(getattr(e, "problem_mark", None), "line", None)
        where = f" (line {line + 1})" if line is not None else ""
        raise ConfigError(f"config file {p} is not valid YAML{where}") from None
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        raise ConfigError(f"config file {p} must hold a mapping of keys, got {type(data).__name__}")
    return data
