"""Fixtures for the verification tests: a small store following wxray.data.schema, written here.

The real store writer lives in wxray/data (written separately); these tests only rely on the documented
conventions: dims time/level/latitude(ascending)/longitude, float32 variables chunked one step per
chunk, and stats/{mean,std,diff_mean,diff_std,climatology} groups.
"""

from __future__ import annotations

# Python's sqlite3 must bind to the system SQLite before ecCodes loads: the eckitlib wheel exports an
# old bundled SQLite (3.26) globally, and MLflow's sqlite tracking store then refuses to start.
import sqlite3  # noqa: F401  isort: skip
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from tests.fixture_files import ERA5_MEMBERS  # noqa: F401  (used by the test modules too)
from wxray.data.schema import open_store
from wxray.job import run_job
from wxray.verify.evaluate import EvaluateConfig, evaluate
from wxray.verify.forecasts import persistence_forecast

LEVELS = (500, 850)


def smooth_fields(rng: np.random.Generator, n_time: int, nlat: int = 16, nlon: int = 32,
                  phi: float = 0.9, n_modes: int = 3) -> np.ndarray:
    """(time, lat, lon) fields: low-wavenumber patterns whose amplitudes follow an AR(1) in time.

    The slow evolution makes persistence skilful at short leads and worse at long ones.
    """
    lat = np.deg2rad(np.linspace(-90 + 90 / nlat, 90 - 90 / nlat, nlat))
    lon = np.deg2rad(np.arange(nlon) * 360 / nlon)
    basis = []
    for m in range(n_modes + 1):
        for n in range(1, n_modes + 1):
            for f in (np.cos, np.sin):
                basis.append(np.cos(lat)[:, None] ** (m > 0) * np.sin(n * lat + 0.3 * n)[:, None] * f(m * lon)[None])
    basis = np.stack(basis) / len(basis) ** 0.5
    amp = np.zeros((n_time, len(basis)))
    amp[0] = rng.standard_normal(len(basis))
    for t in range(1, n_time):
        amp[t] = phi * amp[t - 1] + np.sqrt(1 - phi**2) * rng.standard_normal(len(basis))
    return np.einsum("tk,kij->tij", amp, basis)


def make_store(path: Path, days: int = 6, step_h: int = 6, nlat: int = 16, nlon: int = 32,
               seed: int = 0) -> Path:
    """A store with geopotential (time, level, lat, lon), 2m_temperature and a land-sea mask, each with
    its `units` attribute as ERA5 stores carry it."""
    rng = np.random.default_rng(seed)
    times = pd.date_range("2020-01-01", periods=days * 24 // step_h, freq=f"{step_h}h")
    lat = np.linspace(-90 + 90 / nlat, 90 - 90 / nlat, nlat)
    lon = np.arange(nlon) * 360.0 / nlon
    nt = len(times)
    z = np.stack([5.0e4 + 3.0e3 * smooth_fields(rng, nt, nlat, nlon),
                  1.4e4 + 1.5e3 * smooth_fields(rng, nt, nlat, nlon)], axis=1)
    t2m = 280.0 + 8.0 * smooth_fields(rng, nt, nlat, nlon)
    coords = {"time": times, "level": np.array(LEVELS, dtype=np.int64), "latitude": lat, "longitude": lon}
    ds = xr.Dataset({
        "geopotential": (("time", "level", "latitude", "longitude"), z.astype(np.float32), {"units": "m**2 s**-2"}),
        "2m_temperature": (("time", "latitude", "longitude"), t2m.astype(np.float32), {"units": "K"}),
        "land_sea_mask": (("latitude", "longitude"), (rng.random((nlat, nlon)) > 0.6).astype(np.float32),
                          {"units": "(0 - 1)"}),
    }, coords=coords)
    encoding = {v: {"chunks": (1, *ds[v].shape[1:])} for v in ("geopotential", "2m_temperature")}
    ds.to_zarr(path, mode="w", zarr_format=3, consolidated=False, encoding=encoding)
    write_stats(ds, path)
    return path


def write_stats(ds: xr.Dataset, path: Path) -> None:
    timed = ds[["geopotential", "2m_temperature"]]
    spatial = ["time", "latitude", "longitude"]
    diff = timed.diff("time")
    # Climatology by hour of day, repeated for every day of year (a real one varies with the season).
    by_hour = timed.groupby("time.hour").mean("time")
    clim = by_hour.expand_dims(dayofyear=np.arange(1, 367)).transpose("dayofyear", "hour", ...)
    stats = {"mean": timed.mean(spatial), "std": timed.std(spatial), "diff_mean": diff.mean(spatial),
             "diff_std": diff.std(spatial), "climatology": clim.astype(np.float32)}
    for name, sds in stats.items():
        sds.to_zarr(path, group=f"stats/{name}", mode="w", zarr_format=3, consolidated=False)


def nested_forecast(store_ds: xr.Dataset, init_times, leads_h, m: int = 3, n: int = 4,
                    scale: dict[str, float] | None = None, sigma_b: float = 0.5, sigma_w: float = 1.0,
                    seed: int = 0) -> xr.Dataset:
    """A calibrated nested ensemble (encoder_draw x dropout_draw) around the truth at init + lead.

    Truth and members are exchangeable draws around a common centre: truth = c + b* + w*,
    member (i, j) = c + b_i + w_ij, with b ~ N(0, sigma_b^2), w ~ N(0, sigma_w^2) (times `scale`).
    """
    rng = np.random.default_rng(seed)
    scale = scale or {"geopotential": 200.0, "2m_temperature": 0.5}
    inits = pd.DatetimeIndex(init_times)
    leads = np.array([np.timedelta64(h, "h") for h in leads_h], dtype="timedelta64[ns]")
    out = {}
    for name, s in scale.items():
        da = store_ds[name]
        valid = np.stack([da.sel(time=(inits + lead).values).values for lead in leads], axis=1)  # (I, L, ...)
        shape = valid.shape
        b = rng.standard_normal((*shape[:2], m + 1, *shape[2:])) * sigma_b * s
        w = rng.standard_normal((*shape[:2], m * n + 1, *shape[2:])) * sigma_w * s
        centre = valid - b[:, :, -1] - w[:, :, -1]
        members = (centre[:, :, None, None] + b[:, :, :m, None]
                   + w[:, :, :m * n].reshape(shape[0], shape[1], m, n, *shape[2:]))
        dims = ("init_time", "lead_time", "encoder_draw", "dropout_draw", *da.dims[1:])
        out[name] = (dims, members.astype(np.float32))
    coords = {"init_time": inits.values, "lead_time": leads, "latitude": store_ds.latitude.values,
              "longitude": store_ds.longitude.values, "level": store_ds.level.values}
    return xr.Dataset(out, coords=coords)


@pytest.fixture
def store(tmp_path) -> Path:
    return make_store(tmp_path / "store.zarr")


@pytest.fixture(scope="module")
def store_path(tmp_path_factory) -> Path:
    """One store for a test module's read-only uses."""
    return make_store(tmp_path_factory.mktemp("store") / "store.zarr")


@pytest.fixture(scope="session")
def era5_members() -> xr.Dataset:
    """The 10 real ERA5 EDA members (opened without writing an index beside the fixture)."""
    return xr.open_dataset(ERA5_MEMBERS, engine="cfgrib", backend_kwargs={"indexpath": ""}).load()


def write_zarr(ds: xr.Dataset, path: Path) -> str:
    """Write a forecast/truth dataset as a plain zarr v3 store (as any other tool would) and return its path."""
    ds.to_zarr(path, mode="w", zarr_format=3, consolidated=False)
    return str(path)


def run_evaluate(argv: list[str], capsys) -> tuple[int, dict | None, str]:
    """jobs/evaluate.py in-process: (exit status, RESULT dict or None, stderr)."""
    rc = run_job("evaluate", EvaluateConfig, evaluate, argv=argv)
    out, err = capsys.readouterr()
    lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    return rc, json.loads(lines[-1][len("RESULT "):]) if lines else None, err


def persistence_file(store_path: Path, tmp_path: Path, n_init: int = 16, leads=(6, 24)) -> str:
    """The persistence forecast of the store's first `n_init` times, written as a zarr file."""
    ds = open_store(store_path)
    return write_zarr(persistence_forecast(ds, ds.time.values[:n_init], list(leads)), tmp_path / "persistence.zarr")
