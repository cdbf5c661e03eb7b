"""The stream registry of an obs dir (`obs.yaml`) and the spec a window reader is built from.

An *obs dir* holds `obs.yaml` and one sub-path per stream:

    version: 1
    source_store: /abs/path/of/the/store   # the store synthetic streams were derived from; "" for user streams
    streams:
      stations:                            # the stream name (letters, digits, _ and -; no dots)
        kind: point                        # a key of wxray.data.obs.kinds.KINDS: point | gridded
        path: points                       # point: the Parquet dataset root (hive: stream=<name>/day=YYYY-MM-DD/)
                                           # gridded: <name>.zarr
        variables: [geopotential, ...]
        levels: []                         # point streams with a `level` column: its levels (hPa)
        mean: {geopotential: 9.6e4, ...}   # per variable, over good observations (the reader normalises with it)
        std:  {geopotential: 4.5e3, ...}   # > 0
        noise: {geopotential: 100.0, ...}  # nominal observation-error std, physical units (null = unknown)
        max_per_step: 287                  # point streams: most reports in any interval of one store step
        description: "..."

Channels of a stream (`StreamInfo.channels`, `wxray.data.obs.stream`): its variables, or with levels
`f"{var}_{level}"` variable-major. Every key is checked when the registry is opened: anything malformed is a
one-line DataError naming obs.yaml and the key. What differs between kinds is the kind's (`wxray.data.obs.kinds`):
whether levels are allowed, the least max_per_step, where the data lies and the check of that data (a gridded
stream's grid, latitude and longitude, is read from its zarr then, so `StreamInfo` carries it).

An obs dir is a local path or an fsspec URL (`s3://bucket/obs`, `wxray.data.location`), read in place; one in
object storage is read-only (jobs write obs dirs locally, to be copied up whole).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from wxray.data import location
from wxray.data.obs.kinds import KINDS
from wxray.data.obs.stream import ObsSpec, StreamInfo
from wxray.errors import ConfigError, DataError
from wxray.io import write_text

REGISTRY = "obs.yaml"
REGISTRY_LOCK = ".obs.yaml.lock"  # held while a job adds a stream: two at once would each drop the other's entry
VERSION = 1
NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")  # keys `obs.<name>.*` and hive paths need no dots, '=' or '/'
_STREAM_KEYS = ("kind", "path", "variables", "levels", "mean", "std", "noise", "max_per_step", "description")


@dataclass
class Registry:
    obs_dir: str  # `location.spelled`: a URL as given, a local path as Path spells it
    streams: dict[str, StreamInfo]  # in registry order
    source_store: str = ""
    version: int = VERSION

    @property
    def names(self) -> list[str]:
        return list(self.streams)

    def select(self, names: list[str] | tuple[str, ...] = ()) -> list[StreamInfo]:
        """The named streams in registry order (all for an empty selection); an unknown name is a ConfigError."""
        for n in names:
            if n not in self.streams:
                raise ConfigError(f"stream '{n}' is not in {location.join(self.obs_dir, REGISTRY)} "
                                  f"(streams: {', '.join(self.streams) or 'none'})")
        return [s for n, s in self.streams.items() if not names or n in names]

    def to_yaml(self) -> str:
        doc = {"version": self.version, "source_store": self.source_store,
               "streams": {n: s.to_yaml() for n, s in self.streams.items()}}
        return yaml.safe_dump(doc, sort_keys=False, width=120)


def write_registry(reg: Registry, obs_dir: str | Path | None = None) -> Path:
    """Write `obs.yaml` atomically (into `obs_dir`, default the registry's own); local obs dirs only."""
    target = obs_dir or reg.obs_dir
    if location.is_remote(target):
        raise ConfigError(f"obs dir {target}: obs dirs in object storage are read-only (write it locally, "
                          "then copy it up whole)")
    return write_text(location.local_path(target) / REGISTRY, reg.to_yaml())


def empty_registry(obs_dir: str | Path, source_store: str = "") -> Registry:
    return Registry(location.spelled(obs_dir), {}, source_store=source_store)


def check_name(name: str, where: str) -> str:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ConfigError(f"{where}: stream name {name!r} must start with a letter and hold only letters, digits, "
                          f"'_' and '-'")
    return name


def open_registry(obs_dir: str | Path) -> Registry:
    """Read and check `obs_dir/obs.yaml`, at a path or a URL (gridded streams' grids are read from their zarr).
    An unreachable endpoint or refused credentials are one-line DataErrors naming the file."""
    obs_dir = location.spelled(obs_dir)
    f = location.join(obs_dir, REGISTRY)
    if not location.reachable(f, "obs dir registry"):
        raise DataError(f"{f} does not exist (make an obs dir with jobs/make_sample_obs.py or jobs/prepare_obs.py)")
    try:
        doc = yaml.safe_load(location.read_text(f))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        line = getattr(getattr(e, "problem_mark", None), "line", None)
        where = f" (line {line + 1})" if line is not None else ""
        raise DataError(f"{f} is not readable YAML{where}") from None
    if not isinstance(doc, dict):
        raise DataError(f"{f}: expected a mapping with keys version, source_store, streams")
    if doc.get("version") != VERSION:
        raise DataError(f"{f}: key 'version' must be {VERSION}, got {doc.get('version')!r}")
    unknown = set(doc) - {"version", "source_store", "streams"}
    if unknown:
        raise DataError(f"{f}: unknown key '{sorted(unknown)[0]}' (keys: version, source_store, streams)")
    source = doc.get("source_store") or ""
    if not isinstance(source, str):
        raise DataError(f"{f}: key 'source_store' must be a path or \"\", got {source!r}")
    raw = doc.get("streams")
    if not isinstance(raw, dict) or not raw:
        raise DataError(f"{f}: key 'streams' must be a non-empty mapping of stream name -> description")
    streams = {}
    for name, entry in raw.items():
        try:
            check_name(name, f)
        except ConfigError as e:
            raise DataError(str(e)) from None
        streams[name] = _stream(f, obs_dir, name, entry)
    return Registry(obs_dir, streams, source_store=source, version=VERSION)


def _stream(f: str, obs_dir: str, name: str, entry: Any) -> StreamInfo:
    key = f"streams.{name}"

    def bad(sub: str, expected: str, got: Any) -> DataError:
        return DataError(f"{f}: key '{key}.{sub}' must be {expected}, got {got!r}")

    if not isinstance(entry, dict):
        raise DataError(f"{f}: key '{key}' must be a mapping (kind, path, variables, ...), got {entry!r}")
    unknown = set(entry) - set(_STREAM_KEYS)
    if unknown:
        raise DataError(f"{f}: unknown key '{key}.{sorted(unknown)[0]}' (keys: {', '.join(_STREAM_KEYS)})")
    kind = entry.get("kind")
    if not isinstance(kind, str) or kind not in KINDS:
        raise bad("kind", f"one of {', '.join(KINDS)}", kind)
    k = KINDS[kind]
    path = entry.get("path")
    if not isinstance(path, str) or not path or Path(path).is_absolute() or ".." in Path(path).parts:
        raise bad("path", "a path inside the obs dir", path)
    variables = entry.get("variables")
    if not isinstance(variables, list) or not variables or not all(isinstance(v, str) and v for v in variables):
        raise bad("variables", "a non-empty list of variable names", variables)
    if len(set(variables)) != len(variables):
        raise bad("variables", "a list without repeats", variables)
    levels = entry.get("levels") or []
    if not isinstance(levels, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0
                                               for x in levels) or len(set(levels)) != len(levels):
        raise bad("levels", "a list of distinct positive integers (hPa)", levels)
    if levels and not k.levels:
        raise bad("levels", f"[] for a {kind} stream (its channels are its variables)", levels)
    stats = {}
    for s in ("mean", "std", "noise"):
        d = entry.get(s) if s != "noise" else (entry.get(s) or {})
        if not isinstance(d, dict):
            raise bad(s, "a mapping variable -> number", d)
        for v in variables:
            x = d.get(v)
            if s == "noise" and x is None:
                continue
            ok = isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
            if not ok or (s == "std" and x <= 0) or (s == "noise" and x < 0):
                what = {"mean": "a finite number", "std": "a finite number > 0", "noise": "a number >= 0 or null"}[s]
                raise bad(f"{s}.{v}", what, x)
        extra = set(d) - set(variables)
        if extra:
            raise DataError(f"{f}: key '{key}.{s}.{sorted(extra)[0]}' names no variable of the stream "
                            f"({', '.join(variables)})")
        stats[s] = {v: (None if d.get(v) is None else float(d[v])) for v in variables}
    mps = entry.get("max_per_step", 0)
    if not isinstance(mps, int) or isinstance(mps, bool) or mps < k.min_per_step:
        raise bad("max_per_step", f"an integer >= {k.min_per_step}", mps)
    desc = entry.get("description") or ""
    if not isinstance(desc, str):
        raise bad("description", "a string", desc)
    info = StreamInfo(name=name, kind=kind, path=path, variables=list(variables), levels=list(levels),
                      mean=stats["mean"], std=stats["std"], noise=stats["noise"], max_per_step=mps, description=desc)
    data = k.data_path(info, obs_dir)
    if not location.exists(data):
        raise DataError(f"{f}: stream '{name}' has no data at {data}")
    return k.opened(info, data, f"{f}: stream '{name}'")


def make_obs_spec(obs_dir: str | Path, step: Any, window_steps: int = 1, streams: list[str] | tuple[str, ...] = (),
                  max_quality: int = 0) -> ObsSpec:
    """The spec of a window reader over `streams` of `obs_dir` (() = all; an unknown name is a ConfigError)."""
    reg = open_registry(obs_dir)
    step = pd.Timedelta(step).to_timedelta64().astype("timedelta64[ns]")
    if step <= np.timedelta64(0, "ns"):
        raise ConfigError(f"obs window: the store time step must be positive, got {step}")
    if not isinstance(window_steps, (int, np.integer)) or window_steps < 1:
        raise ConfigError(f"obs window: window_steps must be an integer >= 1, got {window_steps!r}")
    if max_quality not in (0, 1, 2):
        raise ConfigError(f"obs window: max_quality must be 0, 1 or 2, got {max_quality!r}")
    return ObsSpec(obs_dir=reg.obs_dir, streams=reg.select(tuple(streams)), step=step,
                   window_steps=int(window_steps), max_quality=int(max_quality))
