"""The `stats/<name>` groups of a store (see `wxray.data.schema`).

Written per variable (same names as the store), all accumulated in float64, read block by block:

* `stats/mean`, `stats/std` — dims () or (level,): mean and standard deviation over time, latitude and
  longitude together. **Plain, not area-weighted** (every grid point counts the same), population std
  (ddof=0). Missing values (NaN, kept with `allow_missing`) are left out.
* `stats/diff_mean`, `stats/diff_std` — the same of `x[t+1] - x[t]`, only for pairs of steps exactly one
  native step apart (`schema.time_step`, the most common spacing) and, when the store has a `trajectory`
  coordinate, within one trajectory. Time-constant fields get 0 and 0.
* `stats/climatology` — dims (dayofyear, hour, [level,] latitude, longitude), float32: for each
  (dayofyear, hour) of the axes, the mean of every sample at that hour whose day of year lies within a
  centred circular window of ±`clim_window_days` days (circular distance on a 366-day year; samples
  pooled, each weighs the same). The axes hold only the days of year and hours present in the data;
  a cell whose window holds no valid sample is NaN. Time-constant fields hold the field itself, dims
  (latitude, longitude).

Means and stds are float64 scalars / level vectors; the numbers match a direct numpy computation
(`np.mean`, `np.std` on float64) to round-off.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr
from tqdm.auto import tqdm

from wxray.data.schema import LAT, LEVEL, LON, STAT_NAMES, TIME, TRAJECTORY, time_step
from wxray.data.writer import block_steps
from wxray.errors import DataError

DOY, HOUR = "dayofyear", "hour"
YEAR_DAYS = 366


class _Moments:
    """Streaming count / mean / M2 (Chan et al. merge), per level, NaN-aware, float64."""

    def __init__(self, shape: tuple[int, ...]):
        self.n = np.zeros(shape)
        self.mean = np.zeros(shape)
        self.m2 = np.zeros(shape)

    def add(self, x: np.ndarray, axes: tuple[int, ...]) -> None:
        ok = np.isfinite(x)
        n = ok.sum(axis=axes).astype(np.float64)
        if not n.any():
            return
        s = np.where(ok, x, 0.0).sum(axis=axes)
        mean = np.divide(s, n, out=np.zeros_like(s), where=n > 0)
        dev = np.where(ok, x - np.expand_dims(mean, axes), 0.0)
        m2 = (dev * dev).sum(axis=axes)
        tot = self.n + n
        delta = mean - self.mean
        frac = np.divide(n, tot, out=np.zeros_like(tot), where=tot > 0)
        self.m2 = self.m2 + m2 + delta * delta * self.n * frac
        self.mean = self.mean + delta * frac
        self.n = tot

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.where(self.n > 0, self.mean, np.nan)
            return mean, np.sqrt(np.where(self.n > 0, self.m2 / self.n, np.nan))


def circular_day_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    d = np.abs(np.asarray(a)[..., None] - np.asarray(b)[None, ...]) % YEAR_DAYS
    return np.minimum(d, YEAR_DAYS - d)


def valid_pairs(ds: xr.Dataset) -> np.ndarray:
    """Mask over pairs (t, t+1): one native step apart and in the same trajectory."""
    times = ds[TIME].values
    ok = np.diff(times) == time_step(ds)
    if TRAJECTORY in ds.coords:
        traj = ds[TRAJECTORY].values
        ok &= traj[1:] == traj[:-1]
    return ok


def _field_dims(da: xr.DataArray) -> tuple[str, ...]:
    return tuple(d for d in da.dims if d not in (TIME, LAT, LON))


def compute_stats(ds: xr.Dataset, clim_window_days: int = 15, progress: bool | None = None,
                  block_bytes: int | None = None) -> dict[str, xr.Dataset]:
    """All five statistics of a store dataset (lazy or in memory), as Datasets keyed by STAT_NAMES."""
    pairs = valid_pairs(ds)
    if not pairs.any():
        raise DataError("store: no two consecutive time steps one native step apart within a trajectory; "
                        "cannot compute difference statistics")
    idx = pd.DatetimeIndex(ds[TIME].values)
    doy, hour = np.asarray(idx.dayofyear), np.asarray(idx.hour)
    combos, combo_of_t = np.unique(doy * 100 + hour, return_inverse=True)
    c_doy, c_hour = combos // 100, combos % 100
    u_doy, u_hour = np.unique(doy), np.unique(hour)
    weights = ((circular_day_distance(u_doy, c_doy) <= clim_window_days)[:, None, :]
               & (u_hour[:, None] == c_hour[None, :])[None, :, :]).astype(np.float64)  # (doy, hour, combo)

    out: dict[str, dict[str, Any]] = {n: {} for n in STAT_NAMES}
    coords = {c: ds[c].values for c in (LEVEL, LAT, LON) if c in ds.coords}
    nt = ds.sizes[TIME]
    disable = None if progress is None else not progress
    with tqdm(total=len(ds.data_vars), desc="stats", unit="var", disable=disable) as bar:
        for name in map(str, ds.data_vars):
            da = ds[name]
            fdims = _field_dims(da)
            fshape = tuple(da.sizes[d] for d in fdims)
            if TIME not in da.dims:
                x = np.asarray(da.values, dtype=np.float64)
                m = _Moments(fshape)
                m.add(x, axes=(x.ndim - 2, x.ndim - 1))
                mean, std = m.result()
                zero = np.zeros(fshape)
                for key, val in (("mean", mean), ("std", std), ("diff_mean", zero), ("diff_std", zero)):
                    out[key][name] = (fdims, val)
                out["climatology"][name] = (da.dims, x.astype(np.float32))
                bar.update()
                continue
            grid = tuple(da.sizes[d] for d in fdims + (LAT, LON))
            bt = block_steps(int(np.prod(grid)) * 8, block_bytes)
            plain, diff = _Moments(fshape), _Moments(fshape)
            csum = np.zeros((combos.size,) + grid)
            ccnt = np.zeros((combos.size,) + grid)
            axes = (0, len(fdims) + 1, len(fdims) + 2)
            prev = None
            for i0 in range(0, nt, bt):
                i1 = min(nt, i0 + bt)
                x = np.asarray(da.isel({TIME: slice(i0, i1)}).transpose(TIME, *fdims, LAT, LON).values,
                               dtype=np.float64)
                plain.add(x, axes)
                xx = x if prev is None else np.concatenate([prev, x])
                ok = pairs[i0 - (prev is not None): i1 - 1]
                if ok.any():
                    diff.add((xx[1:] - xx[:-1])[ok], axes)
                prev = x[-1:]
                for c in np.unique(combo_of_t[i0:i1]):
                    sel = x[combo_of_t[i0:i1] == c]
                    fin = np.isfinite(sel)
                    csum[c] += np.where(fin, sel, 0.0).sum(axis=0)
                    ccnt[c] += fin.sum(axis=0)
            for key, m in (("", plain), ("diff_", diff)):
                mean, std = m.result()
                out[f"{key}mean"][name] = (fdims, mean)
                out[f"{key}std"][name] = (fdims, std)
            flat_w = weights.reshape(-1, combos.size)
            s = flat_w @ csum.reshape(combos.size, -1)
            n = flat_w @ ccnt.reshape(combos.size, -1)
            with np.errstate(invalid="ignore", divide="ignore"):
                clim = np.where(n > 0, s / np.where(n > 0, n, 1.0), np.nan)
            clim = clim.reshape((u_doy.size, u_hour.size) + grid).astype(np.float32)
            out["climatology"][name] = ((DOY, HOUR) + fdims + (LAT, LON), clim)
            bar.update()

    result: dict[str, xr.Dataset] = {}
    for key in STAT_NAMES:
        c = dict(coords) if key == "climatology" else ({LEVEL: coords[LEVEL]} if LEVEL in coords else {})
        if key == "climatology":
            c.update({DOY: u_doy.astype(np.int64), HOUR: u_hour.astype(np.int64)})
        dsk = xr.Dataset({k: v for k, v in out[key].items()}, coords=c)
        dsk.attrs["description"] = _DESCRIPTIONS[key].format(w=clim_window_days)
        result[key] = dsk
    return result


_DESCRIPTIONS = {
    "mean": "mean over time, latitude, longitude (plain, not area-weighted; NaN skipped); float64",
    "std": "population std (ddof=0) over time, latitude, longitude (plain, not area-weighted); float64",
    "diff_mean": "mean of x[t+1]-x[t] for steps one native step apart within a trajectory",
    "diff_std": "std (ddof=0) of x[t+1]-x[t] for steps one native step apart within a trajectory",
    "climatology": "mean of samples at each hour within a centred circular +-{w} day-of-year window "
                   "(366-day year), only for the days of year and hours present; NaN where no sample",
}


def write_stats(path: str | Path, stats: dict[str, xr.Dataset]) -> None:
    """Write the groups `stats/<name>` into the store at `path` (replacing existing ones)."""
    for key in STAT_NAMES:
        dsk = stats[key]
        enc: dict[str, dict[str, Any]] = {}
        for v in dsk.data_vars:
            dsk[v].encoding = {}
            if key == "climatology" and dsk[v].ndim > 2:
                enc[str(v)] = {"chunks": (1, 1) + dsk[v].shape[2:]}
        dsk.to_zarr(Path(path), group=f"stats/{key}", mode="w", zarr_format=3, consolidated=False,
                    encoding=enc)


def add_stats(path: str | Path, clim_window_days: int = 15,
              progress: bool | None = None) -> dict[str, xr.Dataset]:
    """Compute the statistics of the store at `path` (read lazily) and write them into it."""
    ds = xr.open_dataset(Path(path), engine="zarr", consolidated=False, chunks=None, cache=False)
    stats = compute_stats(ds, clim_window_days=clim_window_days, progress=progress)
    write_stats(path, stats)
    return stats
