"""Search spaces over training config keys, checked before any trial starts, as a Ray Tune param_space.

    space:                                   # dotted keys of jobs/train_sparse.py's config
      model.keep_ratio: {grid: [0.1, 0.25, 0.5, 0.75, 1.0]}
      model.split: {grid: [[1, 10, 1], [2, 8, 2]]}
      model.selection: {choice: [random, laplacian]}
      optim.lr: {loguniform: [1.0e-4, 3.0e-3]}
      model.dropout: {uniform: [0.0, 0.2]}
    repeat: 3                                # seeds per point: train.seed (forecast_e2e: seed) = 0 .. repeat - 1

A trial's config is the base config of the swept job (jobs/train_sparse.py's, or jobs/forecast_e2e.py's for
an inference-time sweep such as the dropout calibration) with one value per key. `grid` keys are crossed (every
combination, `repeat` times); `choice` / `uniform` / `loguniform` keys are drawn `num_samples` times per
grid point. Every grid and choice value, and both ends of a range, is validated as that key's value of the
training config (type and domain) here, so a bad space fails with one line before Ray starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from wxray.config import deep_merge, flatten, from_dict, to_dict
from wxray.errors import ConfigError
from wxray.platform.train.config import TrainSparseConfig

KINDS = ("grid", "choice", "uniform", "loguniform")
SEED_KEY = "train.seed"  # of the training config; a config without `train` has `seed`
SEED_KEYS = (SEED_KEY, "seed")


def seed_key(cls: type) -> str:
    return SEED_KEY if "train" in {f.name for f in fields(cls)} else "seed"


@dataclass(frozen=True)
class Axis:
    key: str  # dotted training config key
    kind: str  # one of KINDS
    values: tuple  # grid / choice values, or (lo, hi)

    def tune_domain(self):
        from ray import tune

        if self.kind == "grid":
            return tune.grid_search(list(self.values))
        if self.kind == "choice":
            return tune.choice(list(self.values))
        lo, hi = self.values
        return tune.uniform(lo, hi) if self.kind == "uniform" else tune.loguniform(lo, hi)


def nest(flat: dict[str, Any]) -> dict[str, Any]:
    """{"model.keep_ratio": 0.5} -> {"model": {"keep_ratio": 0.5}}; dotted and nested keys may mix (a YAML
    `train.epochs: 10` beside a CLI `overrides.train.rollout_steps=0`), later ones win key by key."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        *parents, leaf = key.split(".")
        out = deep_merge(out, _tree(parents + [leaf], value))
    return out


def _tree(path: list[str], value: Any) -> dict[str, Any]:
    for p in reversed(path):
        value = {p: value}
    return value


def trial_config(base: dict[str, Any], params: dict[str, Any], cls: type = TrainSparseConfig):
    """The job config of a trial: `base` (a nested config dict of `cls`) with `params` (dotted keys)."""
    return from_dict(cls, deep_merge(base, nest(params)))


def _tunable_keys(base: dict[str, Any], cls: type) -> set[str]:
    cfg = from_dict(cls, base)
    return {k for k in flatten(to_dict(cfg)) if not k.startswith(("tracking.", "out_dir", "run_name"))}


def parse_space(space: dict[str, Any], base: dict[str, Any], repeat: int,
                cls: type = TrainSparseConfig) -> list[Axis]:
    """The axes of `space` (see the module doc), each value checked against the config `base` of job config
    class `cls`; plus the seed axis when repeat > 1. ConfigError names the key and what was expected."""
    if not isinstance(space, dict) or not space:
        raise ConfigError("config key 'space' is empty: give at least one training key to search, e.g. "
                          "space: {model.keep_ratio: {grid: [0.25, 1.0]}}")
    if repeat < 1:
        raise ConfigError(f"config key 'repeat' must be >= 1 (seeds per point), got {repeat}")
    known, seed = _tunable_keys(base, cls), seed_key(cls)
    axes = []
    for key, spec in space.items():
        where = f"space.{key}"
        if key not in known:
            close = sorted(k for k in known if k.split(".")[-1] == key.split(".")[-1])
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise ConfigError(f"{where}: '{key}' is not a key of the swept job's config{hint}")
        if key == seed and repeat > 1:
            raise ConfigError(f"{where}: searching {seed} and repeat={repeat} at once; use one of them")
        if not isinstance(spec, dict) or len(spec) != 1 or next(iter(spec)) not in KINDS:
            raise ConfigError(f"{where} expects one of {{grid: [...]}}, {{choice: [...]}}, {{uniform: [lo, hi]}}, "
                              f"{{loguniform: [lo, hi]}}, got {spec!r}")
        kind, values = next(iter(spec.items()))
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{where}.{kind} expects a non-empty list, got {values!r}")
        if kind in ("uniform", "loguniform"):
            if len(values) != 2 or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values) \
                    or not values[0] < values[1]:
                raise ConfigError(f"{where}.{kind} expects [lo, hi] with lo < hi, got {values!r}")
            if kind == "loguniform" and values[0] <= 0:
                raise ConfigError(f"{where}.loguniform expects 0 < lo < hi, got {values!r}")
            values = [float(v) for v in values]
        for v in values:  # each value as this key's value of a whole training config (type, domain, validate)
            try:
                trial_config(base, {key: v}, cls)
            except ConfigError as e:
                raise ConfigError(f"{where}: value {v!r} is not valid here ({e})") from None
        axes.append(Axis(key, kind, tuple(values)))
    if repeat > 1:
        axes.append(Axis(seed, "grid", tuple(range(repeat))))
    return axes


def param_space(axes: list[Axis]) -> dict[str, Any]:
    """Tune's param_space: the dotted keys stay flat, under "params" (trial_config nests them)."""
    return {"params": {a.key: a.tune_domain() for a in axes}}


def n_trials(axes: list[Axis], num_samples: int) -> int:
    grid = math.prod(len(a.values) for a in axes if a.kind == "grid")
    return grid * num_samples
