"""The training windows of a store, checked on the driver before anything starts: its config (`data.*`),
the window index split by time, and the completeness check.

`prepare_windows(cfg)` opens (or generates) the store, builds the `WindowSpec` (channels, normalisation,
grid), indexes the valid windows, splits them into train/val/test by time and refuses a window with a
NaN/inf before a worker starts. The Ray Datasets that read these windows are `platform.train.datasets`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import xarray as xr

from wxray.config import InPath, PosFloat, PosInt, Seed
from wxray.console import say
from wxray.data import location
from wxray.data.anchors import split_anchors, valid_anchors
from wxray.data.sample import ensure_sample_store
from wxray.data.schema import LEVEL, TIME, open_stats, open_store
from wxray.data.windows import WindowConfig, WindowSpec, make_spec
from wxray.errors import ConfigError, DataError
from wxray.io import resolve_path

DEFAULT_SAMPLE_STORE = "data/sample_32x64.zarr"


@dataclass
class DataConfig(WindowConfig):
    store: InPath = DEFAULT_SAMPLE_STORE  # the zarr store to train on (jobs/prepare_data.py writes one)
    generate_sample: bool = False  # also generate the sample at a missing non-default store (the default always is)
    sample_grid: tuple[PosInt, PosInt] = (32, 64)  # n_lat, n_lon of a generated sample
    sample_days: PosInt = 25  # days per trajectory of a generated sample
    sample_trajectories: PosInt = 4  # independent runs of a generated sample
    sample_seed: Seed = 0  # seed of a generated sample
    batch_size: PosInt = 8  # windows per training step and worker
    read_batch_size: PosInt = 32  # windows per read task (one block); see BENCHMARKS.md section 2
    read_cpus: PosFloat = 0.25  # CPU share of one read task; small so reads run beside Train workers
    shuffle_seed: Seed = 0  # order of the training windows
    progress_bars: bool = False  # Ray Data's per-operator progress bars


@dataclass
class WindowData:
    spec: WindowSpec
    anchors: dict[str, np.ndarray] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        return {s: int(len(a)) for s, a in self.anchors.items()}


def _generate_sample(cfg: DataConfig, store: Path) -> None:
    default = store.resolve() == resolve_path(DEFAULT_SAMPLE_STORE).resolve()
    if not (default or cfg.generate_sample):
        raise DataError(f"data.store {store} does not exist (make one with jobs/prepare_data.py, or set "
                        f"data.generate_sample=true to generate the shallow-water sample there)")
    say(f"generating the shallow-water sample store {store} (synthetic, NOT ERA5; about a minute)")
    ensure_sample_store(store, grid=tuple(cfg.sample_grid), days=cfg.sample_days,
                        trajectories=cfg.sample_trajectories, seed=cfg.sample_seed)


def check_complete(ds: xr.Dataset, spec: WindowSpec, splits: dict[str, np.ndarray]) -> None:
    """DataError naming variable and time if a window of any split holds NaN/inf, before Ray starts.

    Stores written by wxray record `n_missing`; only others (or ones kept with allow_missing) are scanned,
    one time step per chunk, over the variables the model reads; constant fields are read whole.
    """
    if ds.attrs.get("n_missing") == 0:
        return
    for c in spec.constants:
        n = int((~np.isfinite(ds[c].values)).sum())
        if n:
            raise DataError(f"store {spec.store}: constant field '{c}' has {n} NaN/inf values; training needs "
                            f"complete fields (set data.constants to the fields to use)")
    bad = np.zeros(ds.sizes[TIME], dtype=bool)
    first: dict[int, str] = {}
    for var in dict.fromkeys(c.variable for c in [*spec.inputs, *spec.targets]):
        da = ds[var]
        if LEVEL in da.dims:
            da = da.sel({LEVEL: sorted({c.level for c in [*spec.inputs, *spec.targets] if c.variable == var})})
        here = (~np.isfinite(da)).any([d for d in da.dims if d != TIME]).values
        for t in np.flatnonzero(here & ~bad):
            first.setdefault(int(t), var)
        bad |= here
    if not bad.any():
        return
    used = np.arange(-(spec.history - 1), 1)
    for split, anchors in splits.items():
        steps = np.concatenate([anchors[:, None] + used[None, :], (anchors + spec.lead_steps)[:, None]], axis=1)
        hit = bad[steps].any(axis=1)
        if hit.any():
            t = int(steps[hit][bad[steps[hit]]].min())
            when = np.datetime_as_string(ds[TIME].values[t], "s")
            raise DataError(f"store {spec.store}: variable '{first[t]}' has NaN/inf at {when}, in "
                            f"{int(hit.sum())} {split} window(s); training needs complete fields "
                            f"(set data.*_range to skip that period)")


def prepare_windows(cfg: DataConfig) -> WindowData:
    """Open (or generate) the store, index, split and check its windows. Runs on the driver, no Ray needed."""
    if not cfg.store:
        raise ConfigError("config key 'data.store' is empty; expected the path of a zarr store")
    store = cfg.store
    if not location.is_remote(store) and not location.local_path(store).exists():
        _generate_sample(cfg, location.local_path(store))
    ds = open_store(store)
    where = store if location.is_remote(store) else str(location.local_path(store).resolve())
    spec = make_spec(where, ds, open_stats(store), cfg)
    anchors = valid_anchors(ds, cfg.history, cfg.lead_steps)
    splits = split_anchors(ds, anchors, cfg)
    check_complete(ds, spec, splits)
    rng = np.random.default_rng(cfg.shuffle_seed)
    splits["train"] = rng.permutation(splits["train"])
    return WindowData(spec=spec, anchors=splits)
