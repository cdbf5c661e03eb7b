"""`jobs/prepare_data.py mode=view`: write a view's sidecar (`wxray.data.view`) for a zarr store read in place.

    result = make_view(source, out, variables, levels, time_range, time_stride=4, map_fn=ray_map)

One streaming statistics pass over the selection, one task per (variable, level): each task opens the source
itself and reads it block by block (`stats.compute_stats`), so a task holds one block of one level plus that
level's climatology sums, whatever the length of the record. `map_fn(fn, jobs)` runs the tasks (the builtin
`map` here; Ray tasks from the job, `platform/cluster/fanout.py`) and yields results as they finish. The
sidecar is checked by opening it as every job will (`schema.open_store`) before any statistic is computed,
and appears under its name only when complete: a folder is renamed into place; in a bucket the root
`zarr.json` (which makes it a store) is written last.
"""

from __future__ import annotations

import datetime as dt
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xarray as xr
from tqdm.auto import tqdm

import wxray
from wxray import provenance
from wxray.data import location, view
from wxray.data.anchors import parse_range
from wxray.data.schema import LEVEL, LON, STAT_NAMES, TIME, grid_attrs, open_store
from wxray.data.stats import compute_stats, write_stats
from wxray.errors import DataError
from wxray.io import atomic_path

MapFn = Callable[[Callable[[dict], Any], list[dict]], Iterable[Any]]


@dataclass
class ViewResult:
    out: str
    source: str
    variables: list[str]
    levels: list[int]
    n_times: int
    time_start: str
    time_end: str
    grid: tuple[int, int]
    stats_steps: int
    source_latitude: str

    def figures(self) -> dict[str, Any]:
        return {"store": self.out, "source": self.source, "variables": self.variables, "levels": self.levels,
                "n_times": self.n_times, "time_start": self.time_start, "time_end": self.time_end,
                "grid": f"{self.grid[0]}x{self.grid[1]}", "stats_steps": self.stats_steps,
                "source_latitude": self.source_latitude, "mode": "view"}


def _selection(job: dict) -> xr.Dataset:
    src = location.open_source(job["source"], {"chunks": None})
    return view.select(src, job["variables"], job["levels"], job["time_range"], f"source {job['source']}")


def level_stats(job: dict) -> tuple[str, int | None, dict[str, xr.Dataset]]:
    """The statistics of one variable at one level (`job["level"]`, None for a field without levels)."""
    ds = _selection({**job, "variables": [job["variable"]]})
    if job["level"] is not None:
        ds = ds.sel({LEVEL: [job["level"]]})
    ds = view.stats_sample(ds, job["time_stride"])
    stats = compute_stats(ds, clim_window_days=job["clim_window_days"], progress=False)
    return job["variable"], job["level"], {k: v.load() for k, v in stats.items()}


def _merge(results: list[tuple[str, int | None, dict[str, xr.Dataset]]], levels: dict[str, list[int]]):
    by_var: dict[str, dict[int | None, dict[str, xr.Dataset]]] = {}
    for name, level, stats in results:
        by_var.setdefault(name, {})[level] = stats
    merged = {}
    for key in STAT_NAMES:
        parts = []
        for name, pieces in by_var.items():
            if None in pieces:
                parts.append(pieces[None][key])
            else:
                parts.append(xr.concat([pieces[lev][key] for lev in levels[name]], dim=LEVEL))
        merged[key] = xr.merge(parts, combine_attrs="override")
    return merged


def make_view(source: str, out: str, variables: list[str] | tuple[str, ...] = (),
              levels: list[int] | tuple[int, ...] = (), time_range: str = "", time_stride: int = 1,
              clim_window_days: int = 15, overwrite: bool = False, map_fn: MapFn = map,
              progress: bool | None = None) -> ViewResult:
    if location.exists(out) and not overwrite:
        raise DataError(f"out {out} already exists (set overwrite=true to replace it)")
    if not location.reachable(source, "source"):
        raise DataError(f"source {source} does not exist (expected a zarr store: a folder or a URL)")
    try:
        src = location.open_source(source, {"chunks": None})
    except Exception as e:
        raise DataError(f"source {source} is not a readable zarr store ({type(e).__name__}: {e})"
                        .splitlines()[0]) from None
    rng = tuple(str(t)[:19] for t in parse_range(time_range, "time_range")) if time_range else None
    sel = view.select(src, list(variables), list(levels), rng, f"source {source}")
    names = [str(v) for v in sel.data_vars]
    attrs = {view.ATTR: view.record(source, names, list(levels), rng, src, provenance.metadata_hash(source),
                                    time_stride),
             **grid_attrs(sel[LON].values), "conventions": "wxray view of a WeatherBench 2 / ARCO-ERA5 store",
             "wxray_version": wxray.__version__, "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}
    per_var_levels = {n: ([int(v) for v in sel[LEVEL].values] if LEVEL in sel[n].dims else []) for n in names}
    base = {"source": source, "variables": names, "levels": list(levels), "time_range": rng,
            "time_stride": time_stride, "clim_window_days": clim_window_days}
    jobs = [{**base, "variable": n, "level": lev} for n in names for lev in (per_var_levels[n] or [None])]
    remote = location.is_remote(out)
    with tempfile.TemporaryDirectory(prefix="wxray-view-") as staging:
        final = Path(staging) / "view.zarr" if remote else location.local_path(out)
        with atomic_path(final) as tmp:
            xr.Dataset(attrs=attrs).to_zarr(tmp, zarr_format=3, consolidated=False)
            open_store(tmp)  # the conventions hold through the view before the long pass starts
            results = list(tqdm(map_fn(level_stats, jobs), total=len(jobs), unit="field",
                                desc=f"stats of {Path(source.rstrip('/')).name}",
                                disable=None if progress is None else not progress))
            write_stats(tmp, _merge(results, per_var_levels))
        if remote:
            _upload_last_root(final, out)
    ds = open_store(out)  # as every job will see it
    times = ds[TIME].values
    lat = ds["latitude"].values
    return ViewResult(out=str(out), source=source, variables=names, levels=[int(v) for v in levels] or sorted(
        {lev for v in per_var_levels.values() for lev in v}), n_times=int(times.size),
        time_start=str(times[0])[:19], time_end=str(times[-1])[:19], grid=(int(lat.size), int(ds.sizes[LON])),
        stats_steps=int(view.stats_sample(ds[[names[0]]], time_stride).sizes[TIME]),
        source_latitude=attrs[view.ATTR]["source_latitude"])


def _upload_last_root(local: Path, url: str) -> None:
    """Copy a local store to `url`, its root `zarr.json` last: until then no reader sees a store there."""
    fs, path = location.filesystem(url)
    if fs.exists(path):  # overwrite=true: the old sidecar's files must not outlive it
        fs.rm(path, recursive=True)
    location.put(local, url, exclude=("zarr.json",))
    location.put(local / "zarr.json", location.join(url, "zarr.json"))
