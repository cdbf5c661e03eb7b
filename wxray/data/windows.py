"""Training windows over a gridded store: which (history, target) windows are valid, how they split,
and how one batch of them is read and normalised. No Ray here: the Ray Data layer (`platform/train/datasets.py`) and
the single-process benchmark loop call the same reader.

A window is named by its *anchor*, the index of its last input step t. Inputs are steps
t-H+1 .. t, the target is step t+lead. A window is valid when all those steps are exactly one native
time step apart (no gaps), lie in one ``trajectory`` (when the store has that coordinate), and all lie
in one split's time range, so no window leaks across train/val/test.

The grid a window is read on is the store grid fitted to the model's patch size (`data.grid_fit`,
see gridfit.py): `WindowSpec.latitude`/`longitude` are the kept coordinates, `WindowSpec.grid` the
model grid, and `WindowReader` reads the kept rows/columns and pads them, so training, validation,
rollout and the forecast store all share one fit.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd
import xarray as xr

from wxray.config import Fraction, PosInt
from wxray.data import location
from wxray.data.gridfit import GRID_FIT_MODES, GridFit, GridFitMode, fit_grid
from wxray.data.schema import GLOBAL, LAT, LEVEL, LON, TIME, TRAJECTORY, Channel, Stats, channels, grid_kind, time_step
from wxray.errors import ConfigError, DataError

SPLITS = ("train", "val", "test")


@dataclass
class WindowConfig:
    input_variables: list[str] = field(default_factory=list)  # [] -> every time-dependent variable
    target_variables: list[str] = field(default_factory=list)  # [] -> the input variables
    levels: list[PosInt] = field(default_factory=list)  # hPa; [] -> every level of the store
    constants: list[str] = field(default_factory=list)  # [] -> every constant field of the store
    history: PosInt = 2  # input steps t-H+1 .. t
    lead_steps: PosInt = 1  # native time steps from the last input to the target
    residual: bool = True  # target = normalised tendency y(t+lead) - x(t)
    # Time ranges "start/end" (inclusive, pandas-parsable). Empty -> split_fractions of the record.
    train_range: str = ""  # e.g. 1979-01-01/2017-12-31
    val_range: str = ""  # e.g. 2018-01-01/2019-12-31
    test_range: str = ""  # e.g. 2020-01-01/2020-12-31
    split_fractions: tuple[Fraction, Fraction, Fraction] = (0.7, 0.15, 0.15)  # without ranges: train/val/test
    grid_fit: GridFitMode = "crop"  # patch size not dividing the grid: crop | pad | error (gridfit.py)

    def validate(self) -> None:
        if self.grid_fit not in GRID_FIT_MODES:
            raise ConfigError(f"data.grid_fit must be one of {', '.join(GRID_FIT_MODES)}, got {self.grid_fit!r}")
        if abs(sum(self.split_fractions) - 1) > 1e-6:
            raise ConfigError(f"data.split_fractions must sum to 1, got {list(self.split_fractions)}")


@dataclass
class WindowSpec:
    """Everything a read task needs: plain values, cheap to ship to Ray workers."""

    store: str
    inputs: list[Channel]
    targets: list[Channel]
    constants: list[str]
    history: int
    lead_steps: int
    residual: bool
    in_mean: np.ndarray
    in_std: np.ndarray
    out_mean: np.ndarray  # of the target as trained (tendency when residual)
    out_std: np.ndarray
    const_mean: np.ndarray
    const_std: np.ndarray
    target_in_input: list[int]  # index into `inputs` of each target channel (residual base)
    latitude: np.ndarray  # of the kept grid (what is forecast and scored)
    longitude: np.ndarray
    fit: GridFit | None = None  # None: the whole store grid, unpadded

    def __post_init__(self) -> None:
        if self.fit is None:
            self.fit = GridFit.identity(len(self.latitude), len(self.longitude))

    @property
    def n_in_channels(self) -> int:
        return self.history * len(self.inputs) + len(self.constants)

    @property
    def grid(self) -> tuple[int, int]:
        """The model grid: kept grid plus padding."""
        return self.fit.model_grid

    @property
    def periodic_longitude(self) -> bool:
        """The model grid's first and last columns are neighbours (a whole, unpadded global grid)."""
        return grid_kind(self.longitude) == GLOBAL and not any(self.fit.pad_cols)

    @property
    def kept_grid(self) -> tuple[int, int]:
        return len(self.latitude), len(self.longitude)

    def pad(self, a):
        return self.fit.pad(a)

    def unpad(self, a):
        return self.fit.unpad(a)

    def row_weights(self, w):
        return self.fit.row_weights(w)


def _safe_std(x: np.ndarray) -> np.ndarray:
    return np.where(x > 0, x, 1.0).astype(np.float32)


def make_spec(store: str, ds: xr.Dataset, stats: Stats, cfg: WindowConfig) -> WindowSpec:
    # Sorted: zarr does not promise an order of a group's members, and channel order is part of a model.
    dynamic = sorted(str(v) for v in ds.data_vars if TIME in ds[v].dims)
    in_vars = cfg.input_variables or dynamic
    out_vars = cfg.target_variables or in_vars
    # data.levels must apply to some variable the model reads or predicts (surface-only targets are fine)
    channels(ds, list(dict.fromkeys([*in_vars, *out_vars])), cfg.levels, source=f"store {store}")
    inputs = channels(ds, in_vars, cfg.levels, source=f"store {store}", check_levels=False)
    targets = channels(ds, out_vars, cfg.levels, check_levels=False,
                       source=f"store {store}")
    if cfg.constants:
        consts = list(cfg.constants)
        for c in consts:
            if c not in ds.data_vars or TIME in ds[c].dims:
                raise DataError(f"store {store}: constant field '{c}' not found (need dims latitude, longitude)")
    else:
        consts = sorted(str(v) for v in ds.data_vars if TIME not in ds[v].dims and set(ds[v].dims) == {LAT, LON})
    in_names = [c.name for c in inputs]
    missing = [t.name for t in targets if t.name not in in_names]
    if cfg.residual and missing:
        raise ConfigError(f"data.residual=true needs every target among the inputs; missing {missing}")
    target_in_input = [in_names.index(t.name) if t.name in in_names else -1 for t in targets]
    scale = np.sqrt(cfg.lead_steps)  # random-walk scaling of the one-step difference statistics
    if cfg.residual:
        out_mean = np.array([stats.channel("diff_mean", c) * cfg.lead_steps for c in targets])
        out_std = np.array([stats.channel("diff_std", c) * scale for c in targets])
    else:
        out_mean = np.array([stats.channel("mean", c) for c in targets])
        out_std = np.array([stats.channel("std", c) for c in targets])
    const_mean = np.array([float(stats.mean[c].values) for c in consts]) if consts else np.zeros(0)
    const_std = np.array([float(stats.std[c].values) for c in consts]) if consts else np.zeros(0)
    return WindowSpec(
        store=str(store), inputs=inputs, targets=targets, constants=consts, history=cfg.history,
        lead_steps=cfg.lead_steps, residual=cfg.residual,
        in_mean=np.array([stats.channel("mean", c) for c in inputs], dtype=np.float32),
        in_std=_safe_std(np.array([stats.channel("std", c) for c in inputs])),
        out_mean=out_mean.astype(np.float32), out_std=_safe_std(out_std),
        const_mean=const_mean.astype(np.float32), const_std=_safe_std(const_std),
        target_in_input=target_in_input,
        latitude=ds[LAT].values.astype(np.float64), longitude=ds[LON].values.astype(np.float64),
    )


def fit_spec(spec: WindowSpec, patch_size: int, mode: str) -> WindowSpec:
    """`spec` on its kept grid fitted to `patch_size` (see gridfit.py); a no-op where p divides it.

    The fit is recomputed on the current kept grid, so fitting a fitted spec again composes.
    """
    h, w = spec.kept_grid
    # A global grid wraps around in longitude; a regional box (or a cropped global grid) does not.
    new = fit_grid(h, w, patch_size, mode, periodic=grid_kind(spec.longitude) == GLOBAL)
    (r0, r1), (c0, c1) = new.rows, new.cols
    base_r, base_c = spec.fit.rows[0], spec.fit.cols[0]
    fit = GridFit(mode, (base_r + r0, base_r + r1), (base_c + c0, base_c + c1), new.pad_rows, new.pad_cols,
                  periodic=new.periodic)
    return replace(spec, fit=fit, latitude=spec.latitude[r0:r1], longitude=spec.longitude[c0:c1])


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


_OPEN: dict[str, xr.Dataset] = {}


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


def open_lazy(store: str) -> xr.Dataset:
    """The store opened once per process; chunks=None (no dask): `.values` reads only the chunks it touches."""
    if store not in _OPEN:
        _OPEN[store] = location.open_zarr(store, chunks=None)
    return _OPEN[store]


class WindowReader:
    """Reads and normalises a batch of windows: {"anchor": (b,)} -> {"x", "y", "anchor"}.

    x: (b, H*V_in + V_const, h, w) float32, history-major (step t-H+1's channels first, then constant
    fields); y: (b, V_out, h, w) float32, the normalised target (tendency when residual). (h, w) is the
    model grid: the kept rows/columns of the store, padded as `spec.fit` says.
    """

    def __init__(self, spec: WindowSpec):
        self.spec = spec
        self._ds: xr.Dataset | None = None
        self._const: np.ndarray | None = None

    def _open(self) -> xr.Dataset:
        if self._ds is None:
            self._ds = open_lazy(self.spec.store)
            s = self.spec
            if s.constants:
                c = np.stack([self._ds[v].isel(self._kept()).values for v in s.constants]).astype(np.float32)
                self._const = s.pad((c - s.const_mean[:, None, None]) / s.const_std[:, None, None])
        return self._ds

    def _kept(self) -> dict[str, slice]:
        return {LAT: slice(*self.spec.fit.rows), LON: slice(*self.spec.fit.cols)}

    def _read(self, chs: list[Channel], idx: np.ndarray) -> np.ndarray:
        """(n, C, h, w) float32 on the model grid. One read per variable for all its levels: a chunk holds
        every level of a step (ERA5, WeatherBench 2, ARCO), so a read per channel would fetch and decode
        each chunk once per level (13x at 13 levels)."""
        ds = self._open()
        out = np.empty((len(idx), len(chs), *self.spec.kept_grid), dtype=np.float32)
        by_var: dict[str, list[int]] = {}
        for i, ch in enumerate(chs):
            by_var.setdefault(ch.variable, []).append(i)
        for name, where in by_var.items():
            da = ds[name]
            sel = {TIME: idx, **self._kept()}
            if chs[where[0]].level is not None:
                levels = ds[LEVEL].values
                sel[LEVEL] = [int(np.nonzero(levels == chs[i].level)[0][0]) for i in where]
                values = da.isel(sel).transpose(TIME, LEVEL, ...).values
            else:
                values = da.isel(sel).values[:, None]
            out[:, where] = values
        return self.spec.pad(out)

    def _states(self, anchors: np.ndarray) -> np.ndarray:
        """(b, H, V_in, h, w) input states in physical units."""
        s = self.spec
        in_idx = (anchors[:, None] + np.arange(-(s.history - 1), 1)[None, :]).ravel()
        uniq, inv = np.unique(in_idx, return_inverse=True)
        states = self._read(s.inputs, uniq)[inv]
        return states.reshape(len(anchors), s.history, len(s.inputs), *states.shape[-2:])

    def _normalise_inputs(self, states: np.ndarray) -> np.ndarray:
        s = self.spec
        x = (states - s.in_mean[None, None, :, None, None]) / s.in_std[None, None, :, None, None]
        x = x.reshape(len(states), -1, *x.shape[-2:])
        if self._const is not None:
            x = np.concatenate([x, np.broadcast_to(self._const, (len(states), *self._const.shape))], axis=1)
        return x

    def _check_finite(self, anchors: np.ndarray, *arrays: np.ndarray) -> None:
        ok = np.ones(len(anchors), dtype=bool)
        for a in arrays:
            ok &= np.isfinite(a).all(axis=(1, 2, 3))
        if not ok.all():
            raise DataError(f"store {self.spec.store}: NaN/inf in windows with anchors {anchors[~ok][:5].tolist()}; "
                            "training and forecasts need complete fields")

    def inputs(self, anchors: np.ndarray) -> np.ndarray:
        """x alone, for forecasts from initialisations whose target is not (yet) in the store."""
        anchors = np.asarray(anchors, dtype=np.int64)
        self._open()
        x = self._normalise_inputs(self._states(anchors))
        self._check_finite(anchors, x)
        return np.ascontiguousarray(x, dtype=np.float32)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        s = self.spec
        anchors = np.asarray(batch["anchor"], dtype=np.int64)
        self._open()
        states = self._states(anchors)
        target = self._read(s.targets, anchors + s.lead_steps)
        if s.residual:
            target = target - states[:, -1][:, s.target_in_input]
        y = (target - s.out_mean[None, :, None, None]) / s.out_std[None, :, None, None]
        x = self._normalise_inputs(states)
        self._check_finite(anchors, x, y)
        return {"x": np.ascontiguousarray(x, dtype=np.float32), "y": y.astype(np.float32), "anchor": anchors}


def per_channel(values: np.ndarray, like):
    """(C,) statistics shaped (1, C, 1, 1): numpy for a numpy `like`, else a tensor on `like`'s device."""
    v = values[None, :, None, None]
    if isinstance(like, np.ndarray):
        return v
    import torch

    return torch.as_tensor(v, dtype=like.dtype, device=like.device)


def to_physical(spec: WindowSpec, y_norm, x_norm):
    """Normalised model output (+ its normalised input) -> target state in physical units.

    Works on numpy arrays or torch tensors of shape (b, V_out, h, w) / (b, C_in, h, w).
    """
    y = y_norm * per_channel(spec.out_std, y_norm) + per_channel(spec.out_mean, y_norm)
    if spec.residual:
        v, base = len(spec.inputs), spec.target_in_input
        last = x_norm[:, (spec.history - 1) * v: spec.history * v][:, base]
        y = y + last * per_channel(spec.in_std[base], y) + per_channel(spec.in_mean[base], y)
    return y

