"""Helpers of the data-layer tests (imported by the test modules; fixtures live in conftest.py)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

from tests.fixture_files import ERA5_CORRUPTED as CORRUPTED  # noqa: F401  (re-exported)
from tests.fixture_files import ERA5_MEMBERS as MEMBERS  # noqa: F401
from tests.fixture_files import ERAINT, MISSING_GRIB  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]


def load_job(name: str):
    spec = importlib.util.spec_from_file_location(f"wxray_job_{name}", ROOT / "jobs" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class JobRun:
    def __init__(self, rc: int, out: str, err: str):
        self.rc, self.out, self.err = rc, out, err
        lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        self.result = json.loads(lines[-1][len("RESULT "):]) if lines else None
        self.errors = [ln for ln in err.splitlines() if ln.startswith("error:")]


def assert_failed_cleanly(run: JobRun, out: Path, *needles: str) -> None:
    """Exit 2, exactly one one-line error naming what is wrong, and no store (nor temp store) left."""
    assert run.rc == 2, (run.out, run.err)
    assert run.result is None
    assert len(run.errors) == 1, run.err
    for n in needles:
        assert n in run.errors[0], (n, run.errors[0])
    assert not out.exists()
    assert not list(out.parent.glob(f".{out.name}.tmp-*"))


def synthetic(n_times: int = 6, levels: tuple[int, ...] = (500, 850), nlat: int = 5, nlon: int = 8,
              seed: int = 0, start: str = "2020-01-01", freq: str = "6h", short: bool = True,
              lat_descending: bool = True, lon_start: float = -180.0) -> xr.Dataset:
    """A tiny ERA5-like dataset: z and t on levels, t2m at the surface, lat descending, lon from -180."""
    rng = np.random.default_rng(seed)
    lat = np.linspace(90, -90, nlat) if lat_descending else np.linspace(-90, 90, nlat)
    lon = lon_start + np.arange(nlon) * (360.0 / nlon)
    time = pd.date_range(start, periods=n_times, freq=freq)
    names = ("z", "t", "t2m") if short else ("geopotential", "temperature", "2m_temperature")
    shp3, shp2 = (n_times, len(levels), nlat, nlon), (n_times, nlat, nlon)
    data = {
        names[0]: (("time", "level", "lat", "lon"), 5e4 + 1e3 * rng.standard_normal(shp3).astype(np.float32)),
        names[1]: (("time", "level", "lat", "lon"), 250 + 10 * rng.standard_normal(shp3).astype(np.float32)),
        names[2]: (("time", "lat", "lon"), 280 + 5 * rng.standard_normal(shp2).astype(np.float32)),
    }
    coords = {"time": time, "level": np.array(levels, dtype=np.int32), "lat": lat, "lon": lon}
    ds = xr.Dataset(data, coords=coords)
    for v in ds.data_vars:
        ds[v] = ds[v].astype(np.float32)
    return ds


def to_store_order(da: xr.DataArray) -> xr.DataArray:
    """What the converter makes of a global source array: lat ascending, lon wrapped into [0, 360), ascending."""
    lat = "lat" if "lat" in da.dims else "latitude"
    lon = "lon" if "lon" in da.dims else "longitude"
    da = da.assign_coords({lon: np.mod(da[lon].values, 360.0)})
    return da.sortby(lat).sortby(lon)
