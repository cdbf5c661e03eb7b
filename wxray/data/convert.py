"""Convert ERA5-style sources (GRIB / NetCDF 3-4 / zarr; a file, a glob or a store) into a wxray store.

    convert_source("era5.grib", "data/era5.zarr", variables=["z", "t"], levels=[500, 850], member="mean")

Steps: open every part lazily (`wxray.data.sources`), map it onto the conventions (`wxray.data.normalize`:
long names, latitude ascending, longitude ascending — [0, 360) for a global grid, contiguous for a regional
one, (-180, 180] when it crosses 0 E; store attrs `grid_kind`, `longitude_convention` —, valid time, hPa
levels, auxiliary coordinates dropped), keep the requested variables / levels / ensemble member (or the ensemble mean),
then write float32 blocks (one time step per zarr chunk, zarr v3) into a temporary sibling of `out`
(`wxray.io.atomic_path`), add the `stats/*` groups (`wxray.data.stats`), consolidate the metadata, rename.
Any failure — unreadable or corrupt file, missing variable or level, NaNs, a bad time axis — is a
one-line `DataError` and leaves no store behind.

Missing values (NaN, GRIB bitmaps, also +-inf) are rejected unless `allow_missing=True`: then they stay
NaN (masked), are skipped by the statistics, and their count is in the result and in the store attrs
(`n_missing`, `n_missing_per_variable`).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr
from tqdm.auto import tqdm

import wxray
from wxray.data.normalize import NUMBER, Segment, combine, select
from wxray.data.schema import LAT, LEVEL, LON, TIME, TRAJECTORY, grid_attrs
from wxray.data.sources import first_line, open_source
from wxray.data.stats import add_stats
from wxray.data.writer import StoreWriter, block_steps, clean_attrs
from wxray.errors import DataError
from wxray.io import atomic_path

CONVENTIONS = ("wxray store v1: WeatherBench 2 names, dims (time, [level,] latitude, longitude), latitude "
               "ascending, longitude ascending in [0, 360) (global grids; regional ones contiguous, in "
               "(-180, 180] when crossing 0 E), float32, one time step per chunk")


@dataclass
class ConvertResult:
    store: Path
    variables: list[str]
    levels: list[int]
    n_times: int
    grid: tuple[int, int]
    n_missing: int = 0
    missing_per_variable: dict[str, int] = field(default_factory=dict)
    time_start: str = ""
    time_end: str = ""

    def figures(self) -> dict[str, Any]:
        """Key figures for the job's RESULT line / summary.json."""
        return {"store": str(self.store), "variables": self.variables, "levels": self.levels,
                "n_times": self.n_times, "grid": f"{self.grid[0]}x{self.grid[1]}",
                "n_missing": self.n_missing,
                "missing_per_variable": self.missing_per_variable, "time_start": self.time_start,
                "time_end": self.time_end}


def _array(da: xr.DataArray, where: str, reduce_members: bool) -> tuple[tuple[str, ...], np.ndarray]:
    try:
        arr = np.asarray(da.values)
    except DataError:
        raise
    except Exception as e:  # a decoder error surfacing only when the data are read
        raise DataError(f"{where}: cannot read variable '{da.name}' ({first_line(e)})") from None
    dims = tuple(map(str, da.dims))
    if reduce_members and NUMBER in dims:
        arr = arr.mean(axis=dims.index(NUMBER), dtype=np.float64)
        dims = tuple(d for d in dims if d != NUMBER)
    return dims, arr.astype(np.float32)


class _Missing:
    def __init__(self, allow: bool):
        self.allow = allow
        self.per_var: dict[str, int] = {}

    def check(self, name: str, arr: np.ndarray, times: np.ndarray | None, where: str) -> np.ndarray:
        bad = ~np.isfinite(arr)
        n = int(bad.sum())
        if n:
            if not self.allow:
                when = ""
                if times is not None:
                    t = times[int(np.argmax(bad.reshape(bad.shape[0], -1).any(axis=1)))]
                    when = f" (first at {np.datetime_as_string(t, 's')})"
                n_inf = int(np.isinf(arr).sum())
                what = " and ".join(part for k, part in ((n - n_inf, f"{n - n_inf} missing (NaN)"),
                                                         (n_inf, f"{n_inf} infinite")) if k)
                raise DataError(f"{where}: variable '{name}' has {what} values{when}; expected "
                                f"complete fields (set allow_missing=true to keep them as NaN)")
            arr = np.where(bad, np.float32(np.nan), arr)
        self.per_var[name] = self.per_var.get(name, 0) + n
        return arr


def _block(seg: Segment, i0: int, i1: int, missing: _Missing) -> xr.Dataset:
    blk = seg.ds.isel({TIME: slice(i0, i1)})
    times = blk[TIME].values
    data = {}
    for v in map(str, blk.data_vars):
        dims, arr = _array(blk[v], seg.where, seg.reduce_members)
        data[v] = (dims, missing.check(v, arr, times, seg.where), clean_attrs(blk[v].attrs))
    coords: dict[str, Any] = {TIME: times}
    coords.update({c: blk[c].values for c in (LEVEL, LAT, LON) if c in blk.coords})
    if TRAJECTORY in blk.coords:
        coords[TRAJECTORY] = (TIME, blk[TRAJECTORY].values.astype(np.int64))
    return xr.Dataset(data, coords=coords)


def _constants(const: xr.Dataset, missing: _Missing) -> xr.Dataset:
    data = {}
    for v in map(str, const.data_vars):
        dims, arr = _array(const[v], f"constant field '{v}'", True)
        data[v] = (dims, missing.check(v, arr, None, f"constant field '{v}'"), clean_attrs(const[v].attrs))
    return xr.Dataset(data)


def convert_source(source: str, out: str | Path, variables: list[str] | tuple[str, ...] = (),
                   levels: list[int] | tuple[int, ...] = (), member: int | str | None = None,
                   allow_missing: bool = False, clim_window_days: int = 15, overwrite: bool = False,
                   progress: bool | None = None) -> ConvertResult:
    """Write the store `out` from `source` (a file, a glob or a zarr store) with its statistics."""
    out = Path(out)
    if out.exists() and not overwrite:
        raise DataError(f"out {out} already exists (set overwrite=true to replace it)")
    segments, const = combine(select(open_source(source), variables, levels, member, source=str(source)),
                              order=variables)
    if not segments:
        raise DataError(f"{source}: no time-varying field to convert")
    n_times = sum(s.ds.sizes[TIME] for s in segments)
    if n_times < 2:
        raise DataError(f"{source}: has {n_times} time step; need at least 2 (difference statistics)")
    missing = _Missing(allow_missing)
    ref = segments[0].ds
    grid = (ref.sizes[LAT], ref.sizes[LON])
    with atomic_path(out) as tmp:
        writer = StoreWriter(tmp)
        with tqdm(total=n_times, desc=f"convert {Path(str(source)).name}", unit="step",
                  disable=None if progress is None else not progress) as bar:
            for seg in segments:
                per_step = sum(int(np.prod([seg.ds.sizes[d] for d in seg.ds[v].dims if d != TIME])) * 8
                               for v in seg.ds.data_vars)
                bt = block_steps(per_step)
                for i0 in range(0, seg.ds.sizes[TIME], bt):
                    i1 = min(seg.ds.sizes[TIME], i0 + bt)
                    block = _block(seg, i0, i1, missing)
                    if writer.n_times == 0 and const is not None:
                        block = xr.merge([block, _constants(const, missing)], join="exact")
                    writer.write(block)
                    bar.update(i1 - i0)
        add_stats(tmp, clim_window_days=clim_window_days, progress=progress)
        times = np.concatenate([s.ds[TIME].values for s in segments])
        n_missing = int(sum(missing.per_var.values()))
        attrs = {"source": str(source), "conventions": CONVENTIONS, "wxray_version": wxray.__version__,
                 "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                 "member": "none" if member is None else str(member), "allow_missing": allow_missing,
                 "n_missing": n_missing, "n_missing_per_variable": missing.per_var,
                 "clim_window_days": clim_window_days, **grid_attrs(ref[LON].values)}
        if "wxray_time_note" in ref.attrs:
            attrs["time_note"] = ref.attrs["wxray_time_note"]
        writer.finish(attrs)
    names = [str(v) for v in ref.data_vars] + ([str(v) for v in const.data_vars] if const is not None else [])
    lev = [int(x) for x in ref[LEVEL].values] if LEVEL in ref.coords else []
    return ConvertResult(store=out, variables=names, levels=lev, n_times=n_times, grid=grid,
                         n_missing=n_missing, missing_per_variable=dict(missing.per_var),
                         time_start=str(np.datetime_as_string(times[0], "s")),
                         time_end=str(np.datetime_as_string(times[-1], "s")))


def prepare_data(cfg: Any, progress: bool | None = None) -> ConvertResult:
    """`convert_source` driven by a `PrepareDataConfig`."""
    return convert_source(cfg.source, cfg.out, variables=cfg.variables, levels=cfg.levels, member=cfg.member,
                          allow_missing=cfg.allow_missing, clim_window_days=cfg.clim_window_days,
                          overwrite=cfg.overwrite, progress=progress)
