"""Write a store block by block: zarr v3, float32, one time step per chunk; consolidated at the end.

The first block creates the store (with the time-constant fields), later blocks are appended along
`time`, so memory stays bounded by one block whatever the source size. Callers write into the
temporary path yielded by `wxray.io.atomic_path`, so a failure leaves nothing half-written.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr
import zarr

from wxray.data.schema import TIME

TIME_ENCODING = {"units": "seconds since 1970-01-01T00:00:00", "calendar": "proleptic_gregorian",
                 "dtype": "int64"}
BLOCK_BYTES = 64 * 2**20  # target size of one block in memory


def store_encoding(ds: xr.Dataset) -> dict[str, dict[str, Any]]:
    """One time step per chunk for time-varying fields, one chunk for constants; int64 seconds for time."""
    enc: dict[str, dict[str, Any]] = {}
    for v in ds.data_vars:
        shape = ds[v].shape
        if TIME in ds[v].dims:
            enc[str(v)] = {"chunks": (1, *shape[1:])}
        else:
            enc[str(v)] = {"chunks": shape}
    if TIME in ds.coords:
        enc[TIME] = dict(TIME_ENCODING)
    return enc


def block_steps(bytes_per_step: int, target: int | None = None) -> int:
    """Time steps per block so that a block holds about `target` (default BLOCK_BYTES) bytes."""
    return max(1, int((target or BLOCK_BYTES) // max(1, bytes_per_step)))


def clean_attrs(attrs: dict[str, Any]) -> dict[str, Any]:
    """JSON-safe attrs without GRIB_* bookkeeping."""
    out: dict[str, Any] = {}
    for k, v in attrs.items():
        if str(k).startswith("GRIB_") or str(k).startswith("_"):
            continue
        if isinstance(v, np.generic):
            v = v.item()
        elif isinstance(v, np.ndarray):
            v = v.tolist()
        try:
            json.dumps(v)
        except TypeError:
            v = str(v)
        out[str(k)] = v
    return out


class StoreWriter:
    """Create a store at `path` with the first block, append the next ones along time."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.n_times = 0

    def write(self, block: xr.Dataset) -> None:
        for name in list(block.variables):
            block[name].encoding = {}
        if self.n_times == 0:
            block.to_zarr(self.path, mode="w-", zarr_format=3, consolidated=False,
                          encoding=store_encoding(block))
        else:
            block = block[[v for v in block.data_vars if TIME in block[v].dims]]
            block.to_zarr(self.path, append_dim=TIME, zarr_format=3, consolidated=False)
        self.n_times += int(block.sizes.get(TIME, 0))

    def finish(self, attrs: dict[str, Any]) -> None:
        """The last write: the store's attrs, then consolidated metadata of the whole hierarchy (stats groups
        included), as WeatherBench 2 / ARCO-ERA5 stores have, so plain `xr.open_zarr(path)` opens it quietly."""
        group = zarr.open_group(str(self.path), mode="r+", zarr_format=3)
        group.attrs.update(clean_attrs(attrs))
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Consolidated metadata is currently not part")
            zarr.consolidate_metadata(str(self.path))
