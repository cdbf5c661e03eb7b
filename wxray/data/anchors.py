"""Which windows exist and where they go: anchors, splits, forecast inits.

A window is named by its *anchor*, the index of its last input step t. Inputs are steps
t-H+1 .. t, the target is step t+lead. A window is valid when all those steps are exactly one native
time step apart (no gaps), lie in one ``trajectory`` (when the store has that coordinate), and all lie
in one split's time range, so no window leaks across train/val/test.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import xarray as xr

from wxray.data.schema import TIME, TRAJECTORY, time_step
from wxray.data.windows import WindowConfig, WindowSpec
from wxray.errors import ConfigError, DataError

SPLITS = ("train", "val", "test")


def valid_anchors(ds: xr.Dataset, history: int, lead_steps: int) -> np.ndarray:
    """Anchors t whose steps t-H+1 .. t+lead are contiguous and within one trajectory."""
    times = ds[TIME].values
    n = times.size
    step = time_step(ds)
    contiguous = np.diff(times) == step  # link i -> i+1
    if TRAJECTORY in ds.coords:
        traj = ds[TRAJECTORY].values
        contiguous &= traj[1:] == traj[:-1]
    span = history - 1 + lead_steps  # links a window needs
    if n <= span:
        return np.zeros(0, dtype=np.int64)
    ok = np.ones(n - span, dtype=bool)  # start s = t - H + 1
    for k in range(span):
        ok &= contiguous[k: k + n - span]
    return np.nonzero(ok)[0].astype(np.int64) + history - 1


def parse_range(text: str, key: str) -> tuple[np.datetime64, np.datetime64]:
    """An inclusive "start/end" time range of config key `key`."""
    msg = f"{key} must be 'start/end' dates (e.g. 2000-01-01/2000-03-01), got {text!r}"
    try:
        a, b = (pd.Timestamp(x) for x in text.split("/"))
    except (ValueError, TypeError):
        raise ConfigError(msg) from None
    if pd.isna(a) or pd.isna(b):
        raise ConfigError(msg)
    if b < a:
        raise ConfigError(f"{key}: end {b} is before start {a}")
    return np.datetime64(a, "ns"), np.datetime64(b, "ns")


def split_anchors(ds: xr.Dataset, anchors: np.ndarray, cfg: WindowConfig) -> dict[str, np.ndarray]:
    """Assign windows to splits by time; a window whose steps fall in two splits is dropped."""
    times = ds[TIME].values
    first = times[anchors - (cfg.history - 1)]
    last = times[anchors + cfg.lead_steps]
    if any((cfg.train_range, cfg.val_range, cfg.test_range)):
        # Explicit ranges: a split without one is empty. Ranges are inclusive, so they may not touch:
        # a shared end point would be a training target and a validation input at once.
        ranges = {s: parse_range(getattr(cfg, f"{s}_range"), f"data.{s}_range")
                  for s in SPLITS if getattr(cfg, f"{s}_range")}
        named = list(ranges.items())
        for i, (s1, (a1, b1)) in enumerate(named):
            for s2, (a2, b2) in named[i + 1:]:
                if a1 <= b2 and a2 <= b1:
                    raise ConfigError(f"data.{s1}_range and data.{s2}_range overlap; splits must be disjoint in time")
    else:
        edges = np.cumsum([0.0, *cfg.split_fractions])
        idx = np.clip(np.round(edges * (times.size - 1)).astype(int), 0, times.size - 1)
        ranges = {}
        for i, s in enumerate(SPLITS):
            lo = times[idx[i]] if i == 0 else times[idx[i]] + np.timedelta64(1, "ns")
            ranges[s] = (lo, times[idx[i + 1]])
    out = {}
    for s in SPLITS:
        if s not in ranges:
            out[s] = np.zeros(0, dtype=np.int64)
            continue
        lo, hi = ranges[s]
        out[s] = anchors[(first >= lo) & (last <= hi)]
    return out


def rollout_anchors(ds: xr.Dataset, anchors: np.ndarray, spec: WindowSpec, steps: int) -> np.ndarray:
    """Those of `anchors` (sorted, unique) with their history and truth at every one of `steps` leads in `ds`."""
    ok = valid_anchors(ds, spec.history, steps * spec.lead_steps)
    return np.intersect1d(anchors, ok)


def choose_inits(ds: xr.Dataset, spec: WindowSpec, test: np.ndarray, inits: str, steps: int,
                 store: str) -> np.ndarray:
    """Store time indices (anchors: the last input step) of the inits a forecast starts from: with `inits`
    "start/end" (inclusive) every time in that range with its history in the store (its truth need not be),
    with "" the `test` split's anchors with truth `steps` steps ahead. DataError when there is none."""
    times = ds[TIME].values
    if not inits:
        anchors = rollout_anchors(ds, np.sort(test), spec, steps)
        if len(anchors) == 0:
            raise DataError(f"store {store}: the test split has no init with truth {steps} step(s) ahead; "
                            "give inits=start/end")
        return anchors
    lo, hi = parse_range(inits, "inits")
    ok = valid_anchors(ds, spec.history, 0)  # the history is in the store; the truth need not be
    anchors = ok[(times[ok] >= lo) & (times[ok] <= hi)]
    if len(anchors) == 0:
        first, last = (str(times[ok[i]])[:19] if len(ok) else "-" for i in (0, -1))
        raise DataError(f"inits={inits}: no init in store {store} (inits with {spec.history} step(s) "
                        f"of history run from {first} to {last})")
    return anchors
