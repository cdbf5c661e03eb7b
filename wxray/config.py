"""Typed job configs: defaults in code (dataclasses), YAML overrides, dotted CLI overrides.

    python jobs/train_sparse.py --config configs/train_sparse.yaml model.keep_ratio=0.5 train.epochs=3

Every key and value is checked against the dataclass before any work starts: an unknown key, a value
of the wrong type or outside its domain is a one-line `ConfigError` naming the key. Numeric keys carry
their domain in the type (`PosInt`, `NonNegInt`, `Fraction`, ... : `Annotated[int, Range(1)]`); floats
must be finite. A config class may define `validate(self)` for checks across keys; it is called on every
nested config after loading. Configs become plain dicts only at the Ray boundary (`to_dict`).

A field's one-line doc is its trailing comment in the dataclass source (`wxray.config_help.describe`
prints them for `--help`), so the code and the help text cannot drift apart.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import math
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, get_args, get_origin

import yaml

from wxray.config_renames import reading_saved, renamed
from wxray.config_yaml import load_yaml
from wxray.errors import ConfigError

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Range:
    """The domain of a numeric key: lo <= v <= hi (strict where `*_open`); None = unbounded."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False

    def contains(self, v: float) -> bool:
        if self.lo is not None and (v <= self.lo if self.lo_open else v < self.lo):
            return False
        return not (self.hi is not None and (v >= self.hi if self.hi_open else v > self.hi))

    def __str__(self) -> str:
        lo, hi = _num(self.lo), _num(self.hi)
        if self.hi is None:
            return f"{'>' if self.lo_open else '>='} {lo}"
        if self.lo is None:
            return f"{'<' if self.hi_open else '<='} {hi}"
        return f"in {'(' if self.lo_open else '['}{lo}, {hi}{')' if self.hi_open else ']'}"


def _num(v: float | None) -> str:
    return f"{int(v):d}" if v is not None and float(v).is_integer() else f"{v:g}" if v is not None else ""


@dataclasses.dataclass(frozen=True)
class PathKey:
    """Marks a str key as a file-system path: relative values (and `~`) resolve against the wxray home
    (`wxray.io.home()`) when the config is loaded, so config.yaml and RESULT hold absolute paths; URLs
    stay as they are. `output` keys (directories: run directories, zarr stores) are checked for
    writability before any work starts; `keywords` are values that are not paths (baseline=persistence).
    An output may not be an input or lie inside one, except inside an input that `holds_runs` (a stages
    directory, a training storage root: the runs this job reads sit beside the run it writes)."""

    output: bool = False
    keywords: tuple[str, ...] = ()
    holds_runs: bool = False


InPath = Annotated[str, PathKey()]
OutDir = Annotated[str, PathKey(output=True)]
RunsDir = Annotated[str, PathKey(holds_runs=True)]  # an input folder of run directories


PosInt = Annotated[int, Range(1)]
NonNegInt = Annotated[int, Range(0)]
Seed = Annotated[int, Range(0, 2**32 - 1)]
PosFloat = Annotated[float, Range(0, lo_open=True)]
NonNegFloat = Annotated[float, Range(0)]
Fraction = Annotated[float, Range(0, 1)]  # [0, 1]
Probability = Annotated[float, Range(0, 1, hi_open=True)]  # [0, 1): dropout rates
AnyFloat = Annotated[float, Range()]  # explicitly unbounded (still finite)
AnyInt = Annotated[int, Range()]


def type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Annotated:
        return type_name(get_args(tp)[0])
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if origin in (typing.Union, types.UnionType):
        arms = [a for a in get_args(tp) if a is not type(None)]
        text = " or ".join(type_name(a).removeprefix("one of ") for a in arms)
        return text + (" or null" if len(arms) < len(get_args(tp)) else "")
    if origin is tuple and get_args(tp) and get_args(tp)[-1] is not Ellipsis:  # fixed length: [min, max]
        return "[" + ", ".join(type_name(a) for a in get_args(tp)) + "]"
    if origin in (list, tuple):
        args = [a for a in get_args(tp) if a is not Ellipsis]
        return f"list of {type_name(args[0])}" if args else "list"
    if origin is dict:
        kt, vt = get_args(tp) or (Any, Any)
        return f"mapping {type_name(kt)} -> {type_name(vt)}"
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


class RawOverride:
    """A CLI value as typed and as YAML reads it: string keys keep the text (`run_name=010` stays "010")."""

    def __init__(self, raw: str, parsed: Any):
        self.raw, self.parsed = raw, parsed


def _wants_text(tp: Any) -> bool:
    if tp is str:
        return True
    origin = get_origin(tp)
    if origin is Literal:
        return all(isinstance(a, str) for a in get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return any(_wants_text(a) for a in get_args(tp))
    return False


def _parsed(value: Any) -> Any:
    """An untyped value with every CLI override inside it as YAML reads it (nested under a mapping key)."""
    if isinstance(value, RawOverride):
        return value.parsed
    if isinstance(value, dict):
        return {k: _parsed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_parsed(v) for v in value]
    return value


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Return `value` converted to `tp`, or raise ConfigError naming `key`."""
    origin = get_origin(tp)
    if origin is Annotated:
        base, *extras = get_args(tp)
        out = _coerce(value, base, key)
        for rng in (e for e in extras if isinstance(e, Range)):
            if isinstance(out, (int, float)) and not rng.contains(out):
                raise ConfigError(f"config key '{key}' must be {rng}, got {out!r}")
        return out
    if isinstance(value, RawOverride) and origin not in (typing.Union, types.UnionType):
        value = value.raw if _wants_text(tp) else value.parsed  # each Union arm decides for itself
    if origin in (typing.Union, types.UnionType):
        errors = []
        if type(None) in get_args(tp) and (value.parsed if isinstance(value, RawOverride) else value) is None:
            return None  # `key=null` on an optional key, even when another arm is str
        for arm in get_args(tp):
            if arm is type(None):
                continue
            try:
                return _coerce(value, arm, key)
            except ConfigError as e:
                errors.append(str(e))
        domain = [e for e in errors if "' must be " in e]  # the right type, out of its range: say that
        if domain:
            raise ConfigError(domain[0])
        shown = value.raw if isinstance(value, RawOverride) else value
        raise ConfigError(f"config key '{key}' expects {type_name(tp)}, got {shown!r}")
    if origin is Literal:
        if value in get_args(tp):
            return value
        raise ConfigError(f"config key '{key}' expects {type_name(tp)}, got {value!r}")
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"config key '{key}' is a section; expected a mapping, got {value!r}")
        return _build(tp, value, key)
    if origin in (list, tuple):
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            raise ConfigError(f"config key '{key}' expects a list, got {value!r}")
        args = get_args(tp)
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(args) != len(value):
                raise ConfigError(f"config key '{key}' expects {len(args)} values, got {list(value)!r}")
            return tuple(_coerce(v, a, f"{key}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
        item = args[0] if args else Any
        items = [_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"config key '{key}' expects a mapping, got {value!r}")
        kt, vt = get_args(tp) or (Any, Any)
        return {_coerce(k, kt, f"{key}.{k}"): _coerce(v, vt, f"{key}.{k}") for k, v in value.items()}
    if tp is Any:
        return _parsed(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is float:
        number = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):  # YAML 1.1 reads "3e-4" (no dot) as a string
            try:
                number = float(value)
            except ValueError:
                pass
        if number is not None:
            if not math.isfinite(number):
                raise ConfigError(f"config key '{key}' expects a finite number, got {value!r}")
            return number
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)  # e.g. `run_name: 2024` in a YAML file
        if isinstance(value, (dt.date, dt.datetime)):
            return value.isoformat()  # `run_name: 2024-01-01` in a YAML file
    elif isinstance(value, tp):
        return value
    raise ConfigError(f"config key '{key}' expects {type_name(tp)}, got {value!r}")


def _build(cls: type[T], values: dict[str, Any], prefix: str = "") -> T:
    values = renamed(cls, values, f"{prefix}." if prefix else "")
    hints = typing.get_type_hints(cls, include_extras=True)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs = {}
    for k, v in values.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if k not in fields:
            where = f"under '{prefix}'" if prefix else "at top level"
            raise ConfigError(f"unknown config key '{key}' (known keys {where}: {', '.join(fields)})")
        factory = fields[k].default_factory
        if isinstance(v, dict) and factory is not dataclasses.MISSING and dataclasses.is_dataclass(hints[k]):
            # a section given in part keeps the defaults its owner chose for the rest (the factory's, which
            # may differ from the section class's own: the e2e data section has history 1)
            v = deep_merge(to_dict(factory()), v)
        kwargs[k] = _coerce(v, hints[k], key)
    return cls(**kwargs)


def deep_merge(base: dict, update: dict) -> dict:
    """`update` laid over `base` section by section; neither is changed."""
    out = dict(base)
    for k, v in update.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def to_dict(cfg: Any) -> dict[str, Any]:
    """Plain nested dict (tuples become lists) for YAML, MLflow params and the Ray boundary."""

    def plain(v: Any) -> Any:
        if dataclasses.is_dataclass(v):
            return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v

    return plain(cfg)


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else k
        if isinstance(v, dict):
            out.update(flatten(v, key))
        else:
            out[key] = v
    return out


def from_dict(cls: type[T], values: dict[str, Any], saved: bool = False) -> T:
    """Inverse of `to_dict` (used on Ray workers): same checks as loading from YAML. `saved`: the values are
    a run's own config.yaml, written before a key was renamed: read under the old names without a notice."""
    with reading_saved() if saved else contextlib.nullcontext():
        cfg = _build(cls, values)
    _validate(cfg)
    return cfg


def path_keys(cfg: Any, prefix: str = "") -> list[tuple[Any, str, str, PathKey]]:
    """(owner config, field name, dotted key, marker) of every PathKey field, nested sections included."""
    hints = typing.get_type_hints(type(cfg), include_extras=True)
    out = []
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(v):
            out.extend(path_keys(v, key + "."))
            continue
        tp = hints[f.name]
        if get_origin(tp) is Annotated:
            out.extend((cfg, f.name, key, m) for m in get_args(tp)[1:] if isinstance(m, PathKey))
    return out


MODEL_URIS = ("models:/", "runs:/")  # MLflow model URIs (the registry; a run's artifacts): not paths


def resolve_paths(cfg: Any, resolve: typing.Callable[[str], Path]) -> None:
    """Make every non-empty PathKey value absolute with `resolve` (URLs, MLflow model URIs and keywords stay as
    they are)."""
    for owner, name, _, marker in path_keys(cfg):
        value = getattr(owner, name)
        if value and "://" not in value and not value.startswith(MODEL_URIS) and value not in marker.keywords:
            setattr(owner, name, str(resolve(value)))  # a glob stays a pattern, anchored at the home


def _validate(cfg: Any) -> None:
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        if dataclasses.is_dataclass(v):
            _validate(v)
    if hasattr(cfg, "validate"):
        cfg.validate()


def parse_override(token: str) -> dict[str, Any]:
    if "=" not in token or token.startswith("="):
        raise ConfigError(f"override '{token}' is not of the form key=value (e.g. train.epochs=3)")
    key, raw = token.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError:
        value = raw
    # "2017-01-01" must stay a string: YAML would make it a date.
    if not isinstance(value, (str, int, float, bool, list, dict, type(None))):
        value = raw
    nested: dict[str, Any] = {}
    cur = nested
    parts = key.strip().split(".")
    for p in parts[:-1]:
        cur = cur.setdefault(p, {})
    cur[parts[-1]] = RawOverride(raw, value)
    return nested


def load_config(cls: type[T], argv: list[str] | None = None) -> T:
    """Defaults of `cls`, then `--config FILE` (YAML), then `key=value` overrides in order."""
    argv = list(argv or [])
    values: dict[str, Any] = {}
    overrides: list[str] = []
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok in ("--config", "-c"):
            if i + 1 >= len(argv):
                raise ConfigError("--config needs a file path")
            values = deep_merge(values, load_yaml(argv[i + 1]))
            i += 2
            continue
        if tok.startswith("--config="):
            values = deep_merge(values, load_yaml(tok.split("=", 1)[1]))
        elif tok.startswith("-"):
            raise ConfigError(f"unknown option '{tok}' (use --config FILE and key=value overrides)")
        else:
            overrides.append(tok)
        i += 1
    for tok in overrides:
        values = deep_merge(values, parse_override(tok))
    return from_dict(cls, values)


def dump_yaml(cfg: Any) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)
