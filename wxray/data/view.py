r"""A view: a WeatherBench 2 / ARCO-ERA5 zarr store read in place, through a small sidecar store.

    python jobs/prepare_data.py mode=view out=data/wb2.view \
        source=gs://weatherbench2/datasets/era5/1959-2023_01_10-6h-240x121_equiangular_with_poles_conservative.zarr \
        variables=[geopotential,temperature,2m_temperature] levels=[500,850] time_range=1979-01-01/2017-12-31

The sidecar is a zarr v3 group (a folder or a URL, a few MB) that holds

* attrs `wxray_view`: the source URL, the chosen variables, levels and time range, the source's
  latitude order, and the source's metadata fingerprint when the view was made;
* the `stats/*` groups of the chosen fields (`wxray.data.stats`, one streaming pass, `time_stride`);
* the store attrs `grid_kind` / `longitude_convention`.

Opening the sidecar as a store (`location.open_zarr`, hence `schema.open_store`, `windows.open_lazy`, every
job) opens the source lazily instead and selects from it (`through`): the chosen variables, levels in the
source's order, the time range, and latitude turned south to north when the source runs north to south
(WeatherBench 2 and ARCO both do). Nothing of the fields is copied; a read task fetches only the chunks of
its windows, whatever the source's chunking (one step per chunk in ARCO, several in WeatherBench 2). The
sidecar's own groups (`group="stats/mean"`, ...) open as they are.

The invariant: a view reads as the store `jobs/prepare_data.py mode=copy` would have written from the same
source and selection, up to the statistics' time stride.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import xarray as xr

from wxray.data.dims import LAT, LEVEL, TIME
from wxray.errors import DataError

ATTR = "wxray_view"


def is_view(ds: xr.Dataset) -> bool:
    return ATTR in ds.attrs


def select(ds: xr.Dataset, variables: list[str], levels: list[int], time_range: tuple[str, str] | None,
           where: str) -> xr.Dataset:
    """The view's selection of the source dataset `ds` (lazy): variables, levels, times, latitude ascending.
    A variable or level the source lacks is a one-line DataError naming `where`."""
    missing = [v for v in variables if v not in ds.data_vars]
    if missing:
        have = ", ".join(sorted(map(str, ds.data_vars))[:12])
        raise DataError(f"{where}: variable '{missing[0]}' not found (it has {have}"
                        f"{', ...' if len(ds.data_vars) > 12 else ''})")
    out = ds[list(variables)] if variables else ds
    if levels and LEVEL not in ds.dims:
        raise DataError(f"{where}: levels={list(levels)} asked for, but it has no '{LEVEL}' dimension")
    if levels and LEVEL in out.dims:
        have = [int(v) for v in ds[LEVEL].values]
        lost = [lev for lev in levels if lev not in have]
        if lost:
            raise DataError(f"{where}: level {lost[0]} not found (levels: {have})")
        out = out.isel({LEVEL: [i for i, lev in enumerate(have) if lev in levels]})
    if time_range:
        out = out.sel({TIME: slice(np.datetime64(time_range[0]), np.datetime64(time_range[1]))})
        if out.sizes.get(TIME, 0) < 2:
            raise DataError(f"{where}: time_range {time_range[0]}/{time_range[1]} holds "
                            f"{out.sizes.get(TIME, 0)} time step(s); need at least 2")
    lat = out[LAT].values
    if lat.size > 1 and lat[0] > lat[-1]:
        out = out.isel({LAT: slice(None, None, -1)})  # lazy: zarr still reads whole chunks, rows reversed
    return out


def record(source: str, variables: list[str], levels: list[int], time_range: tuple[str, str] | None,
           src: xr.Dataset, fingerprint: str, time_stride: int) -> dict[str, Any]:
    """The `wxray_view` attrs of a sidecar."""
    lat = src[LAT].values
    return {"source": source, "variables": list(variables), "levels": [int(v) for v in levels],
            "time_range": list(time_range) if time_range else [],
            "source_latitude": "north_to_south" if lat.size > 1 and lat[0] > lat[-1] else "south_to_north",
            "source_metadata_sha256": fingerprint, "stats_time_stride": int(time_stride)}


def through(sidecar: xr.Dataset, open_source: Callable[[str], xr.Dataset]) -> xr.Dataset:
    """The fields a sidecar stands for: its source opened by `open_source`, selected as recorded."""
    v = sidecar.attrs[ATTR]
    where = f"view source {v['source']}"
    try:
        src = open_source(v["source"])
    except DataError:
        raise
    except Exception as e:
        raise DataError(f"{where}: cannot be opened ({type(e).__name__}: {e})".splitlines()[0]) from None
    rng = tuple(v["time_range"]) if v.get("time_range") else None
    ds = select(src, v.get("variables") or [], v.get("levels") or [], rng, where)
    ds.attrs = {**ds.attrs, **{k: val for k, val in sidecar.attrs.items() if k != ATTR}, ATTR: v}
    return ds


def stats_sample(ds: xr.Dataset, stride: int) -> xr.Dataset:
    """The steps a statistics pass reads at `time_stride`: pairs (t, t+1) every `stride` steps, so the
    difference statistics stay those of one native step (`stats.valid_pairs` keeps only such pairs)."""
    if stride <= 1:
        return ds
    n = ds.sizes[TIME]
    starts = np.arange(0, n - 1, stride)
    idx = np.unique(np.concatenate([starts, starts + 1]))
    return ds.isel({TIME: idx})
