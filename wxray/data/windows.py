"""Training windows over a gridded store: which (history, target) windows are valid, how they split,
and how one batch of them is read and normalised. No Ray here: the Ray Data layer (`platform/train/datasets.py`) and
the single-process benchmark loop call the same reader.

A window is named by its *anchor* (the index of its last input step; see anchors.py).

The grid a window is read on is the store grid fitted to the model's patch size (`data.grid_fit`,
see gridfit.py): `WindowSpec.latitude`/`longitude` are the kept coordinates, `WindowSpec.grid` the
model grid, and `WindowReader` reads the kept rows/columns and pads them, so training, validation,
rollout and the forecast store all share one fit.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import xarray as xr

from wxray.config import Fraction, PosInt
from wxray.data import location
from wxray.data.gridfit import GRID_FIT_MODES, GridFit, GridFitMode, fit_grid
from wxray.data.schema import GLOBAL, LAT, LEVEL, LON, TIME, Channel, Stats, channels, grid_kind
from wxray.errors import ConfigError, DataError


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


_OPEN: dict[str, xr.Dataset] = {}


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
        """(n, C, h, w) float32 on the model grid at the sorted, unique time indices `idx`.

        One read per variable for all its levels: a chunk holds every level of a step (ERA5, WeatherBench 2,
        ARCO), so a read per channel would fetch and decode each chunk once per level (13x at 13 levels).
        Consecutive steps and levels are read as slices (zarr's basic indexing, no index arrays)."""
        ds = self._open()
        out = np.empty((len(idx), len(chs), *self.spec.kept_grid), dtype=np.float32)
        by_var: dict[str, list[int]] = {}
        for i, ch in enumerate(chs):
            by_var.setdefault(ch.variable, []).append(i)
        times = _as_slice(idx)
        for name, where in by_var.items():
            sel = {TIME: times, **self._kept()}
            rows = _as_slice(np.asarray(where))
            if chs[where[0]].level is not None:
                levels = ds[LEVEL].values
                sel[LEVEL] = _as_slice(np.array([np.nonzero(levels == chs[i].level)[0][0] for i in where]))
                out[:, rows] = ds[name].isel(sel).transpose(TIME, LEVEL, ...).values
            else:
                out[:, rows] = ds[name].isel(sel).values[:, None]
        return self.spec.pad(out)

    def _steps(self, anchors: np.ndarray, targets: bool) -> tuple[np.ndarray, np.ndarray]:
        """(sorted unique time indices, (b, H [+1]) position of each window's steps among them): a step that
        several windows of the batch share -- history, or one window's target and the next one's input -- is
        read once."""
        s = self.spec
        offsets = np.arange(-(s.history - 1), 1)
        if targets:
            offsets = np.append(offsets, s.lead_steps)
        uniq, inv = np.unique(anchors[:, None] + offsets[None, :], return_inverse=True)
        return uniq, inv.reshape(len(anchors), len(offsets))

    def _normalised_inputs(self, states: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """x from the physical input states at the batch's steps: normalised in place, then each history
        step's channels gathered straight into their slice of x (no stacked copy, no concatenation)."""
        s = self.spec
        np.subtract(states, s.in_mean[None, :, None, None], out=states)
        np.divide(states, s.in_std[None, :, None, None], out=states)
        v, b = len(s.inputs), len(pos)
        x = np.empty((b, s.n_in_channels, *states.shape[-2:]), dtype=np.float32)
        for i, steps in enumerate(pos):  # one contiguous block copy per (window, step): 3x np.take's speed
            for k in range(s.history):
                x[i, k * v:(k + 1) * v] = states[steps[k]]
        if self._const is not None:
            x[:, s.history * v:] = self._const
        return x

    def _target(self, states: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """(b, V_out, h, w) physical target from the batch's states (the tendency from step t when residual),
        window by window: contiguous copies, no fancy-indexed temporaries."""
        s = self.spec
        chans = s.target_in_input
        whole = chans == list(range(len(s.inputs)))
        y = np.empty((len(pos), len(chans), *states.shape[-2:]), dtype=np.float32)
        for i, steps in enumerate(pos):
            y[i] = states[steps[-1]] if whole else states[steps[-1], chans]
            if s.residual:
                y[i] -= states[steps[s.history - 1]] if whole else states[steps[s.history - 1], chans]
        return y

    def _check_finite(self, anchors: np.ndarray, states: np.ndarray, pos: np.ndarray,
                      y: np.ndarray | None = None) -> None:
        """Every window's input steps (checked once per step), the constant fields and `y` finite."""
        step_ok = np.isfinite(states).all(axis=(1, 2, 3))
        ok = step_ok[pos[:, :self.spec.history]].all(axis=1)
        if self._const is not None and not np.isfinite(self._const).all():
            ok[:] = False
        if y is not None:
            ok &= np.isfinite(y).all(axis=(1, 2, 3))
        if not ok.all():
            raise DataError(f"store {self.spec.store}: NaN/inf in windows with anchors {anchors[~ok][:5].tolist()}; "
                            "training and forecasts need complete fields")

    def inputs(self, anchors: np.ndarray) -> np.ndarray:
        """x alone, for forecasts from initialisations whose target is not (yet) in the store."""
        anchors = np.asarray(anchors, dtype=np.int64)
        self._open()
        steps, pos = self._steps(anchors, targets=False)
        states = self._read(self.spec.inputs, steps)
        self._check_finite(anchors, states, pos)
        return self._normalised_inputs(states, pos)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        s = self.spec
        anchors = np.asarray(batch["anchor"], dtype=np.int64)
        self._open()
        steps, pos = self._steps(anchors, targets=True)
        states = self._read(s.inputs, steps)  # physical, every step of the batch (the targets' too)
        if all(i >= 0 for i in s.target_in_input):
            y = self._target(states, pos)
        else:  # a target the model does not read (residual=false): its own channels
            t_steps, t_pos = np.unique(anchors + s.lead_steps, return_inverse=True)
            y = self._read(s.targets, t_steps)[t_pos]
        np.subtract(y, s.out_mean[None, :, None, None], out=y)
        np.divide(y, s.out_std[None, :, None, None], out=y)
        self._check_finite(anchors, states, pos, y)
        return {"x": self._normalised_inputs(states, pos), "y": y, "anchor": anchors}


def _as_slice(idx: np.ndarray) -> slice | np.ndarray:
    """Sorted unique indices as a slice where they are consecutive (basic indexing), else as they are."""
    if len(idx) and (np.diff(idx) == 1).all():
        return slice(int(idx[0]), int(idx[-1]) + 1)
    return idx


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

