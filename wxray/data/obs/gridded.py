"""Gridded streams on disk: one zarr v3 store per stream, `<obs dir>/<name>.zarr`.

    obs  (time, channel, latitude, longitude) float32, NaN = no data (outside a swath, dropped pixel)
    coords: time (datetime64[ns], strictly increasing), channel (the stream's variables, as strings),
            latitude (degrees, ascending), longitude (degrees, global, ascending in [0, 360))

The stream's grid is its own (a satellite's), not the model grid. One time step per chunk, metadata
consolidated at the end (as the stores `wxray.data.writer` writes), so opening reads one JSON document.
Callers write into a temporary path (`wxray.io.atomic_path`). Readers take a path or a URL
(`wxray.data.location`): a stream in object storage is read in place, chunk by chunk.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr
import zarr

from wxray.data import location
from wxray.data.writer import TIME_ENCODING, clean_attrs
from wxray.errors import DataError

OBS, CHANNEL = "obs", "channel"
DIMS = ("time", CHANNEL, "latitude", "longitude")


def write_gridded(path: str | Path, times: np.ndarray, channels: list[str], latitude: np.ndarray,
                  longitude: np.ndarray, values: np.ndarray, attrs: dict[str, Any] | None = None) -> Path:
    """Write `values` (time, channel, latitude, longitude) as a gridded stream at `path` (which must not exist)."""
    values = np.asarray(values, dtype=np.float32)
    expected = (len(times), len(channels), len(latitude), len(longitude))
    if values.shape != expected:
        raise ValueError(f"gridded stream {path}: values of shape {values.shape}, expected {expected}")
    ds = xr.Dataset(
        {OBS: (DIMS, values)},
        coords={"time": np.asarray(times, dtype="datetime64[ns]"),
                CHANNEL: np.array(list(channels), dtype=object),  # variable-length strings: a zarr v3 dtype
                "latitude": np.asarray(latitude, dtype=np.float64),
                "longitude": np.asarray(longitude, dtype=np.float64)},
        attrs=clean_attrs(attrs or {}))
    enc = {OBS: {"chunks": (1, *expected[1:])}, "time": dict(TIME_ENCODING)}
    ds.to_zarr(path, mode="w-", zarr_format=3, consolidated=False, encoding=enc)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Consolidated metadata is currently not part")
        zarr.consolidate_metadata(str(path))
    return Path(path)


def open_gridded(path: str | Path, where: str = "") -> xr.Dataset:
    """The stream's dataset at a path or URL, lazily (no dask: indexing reads just the chunks asked for)."""
    where = where or f"gridded stream {path}"
    p = location.spelled(path)
    if not location.reachable(p, f"{where}:"):
        raise DataError(f"{where}: {p} does not exist")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a store without consolidated metadata still opens
            ds = location.open_zarr(p, chunks=None, consolidated=None)  # one metadata read where consolidated
    except Exception as e:  # zarr raises many types for a foreign directory
        raise DataError(f"{where}: {p} is not a readable zarr store ({type(e).__name__}: {e})".splitlines()[0]) \
            from None
    if OBS not in ds.data_vars or tuple(ds[OBS].dims) != DIMS:
        raise DataError(f"{where}: {p} needs a variable '{OBS}' with dims {DIMS}")
    return ds


def read_grid(path: str | Path, variables: list[str], where: str) -> tuple[np.ndarray, np.ndarray]:
    """(latitude, longitude) of a gridded stream, checked against the conventions and its registry entry."""
    ds = open_gridded(path, where)
    chans = [str(c) for c in ds[CHANNEL].values]
    if chans != list(variables):
        raise DataError(f"{where}: channels {chans} of {path} differ from its registry variables {list(variables)}")
    lat = np.asarray(ds["latitude"].values, dtype=np.float64)
    lon = np.asarray(ds["longitude"].values, dtype=np.float64)
    if lat.size > 1 and not np.all(np.diff(lat) > 0) or np.abs(lat).max(initial=0) > 90:
        raise DataError(f"{where}: latitude of {path} must ascend within [-90, 90]")
    if lon.size > 1 and not np.all(np.diff(lon) > 0) or lon.min(initial=0) < 0 or lon.max(initial=0) >= 360:
        raise DataError(f"{where}: longitude of {path} must ascend within [0, 360)")
    t = ds["time"].values
    if t.size > 1 and not np.all(np.diff(t) > np.timedelta64(0, "ns")):
        raise DataError(f"{where}: time of {path} must be strictly increasing")
    return lat, lon


class GriddedSource:
    """A gridded stream opened once: its time axis in memory, its values read by time index on demand."""

    def __init__(self, path: str | Path, where: str = ""):
        self.path = str(path)
        ds = open_gridded(path, where)
        self.times = np.asarray(ds["time"].values, dtype="datetime64[ns]")
        self._obs = ds[OBS].variable  # lazily indexed backend array

    def in_window(self, lo: np.datetime64, hi: np.datetime64) -> np.ndarray:
        """Indices of the time steps with lo < time <= hi, ascending."""
        a = np.searchsorted(self.times, lo, side="right")
        b = np.searchsorted(self.times, hi, side="right")
        return np.arange(a, b)

    def read(self, idx: np.ndarray) -> np.ndarray:
        """(len(idx), C, h, w) float32 for ascending time indices."""
        if len(idx) == 0:
            return np.empty((0, *self._obs.shape[1:]), dtype=np.float32)
        return np.asarray(self._obs[np.asarray(idx, dtype=np.int64)].values, dtype=np.float32)


def latest_valid(stack: np.ndarray) -> np.ndarray:
    """Per pixel and channel, the last non-NaN value along axis 0 (NaN where all are NaN)."""
    out = np.full(stack.shape[1:], np.nan, dtype=np.float32)
    for x in stack:  # oldest to newest: a newer valid value replaces an older one
        ok = ~np.isnan(x)
        out[ok] = x[ok]
    return out
