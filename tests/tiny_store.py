"""A tiny store written directly with xarray (independent of wxray.data's writer): the training, forecast and
sweep tests' learnable travelling waves."""

from __future__ import annotations

import numpy as np
import pandas as pd
import xarray as xr

VARS = ("geopotential", "temperature")


def write_tiny_store(path, n_traj=3, steps=12, grid=(8, 16), levels=(500, 850), seed=0, with_const=True):
    rng = np.random.default_rng(seed)
    n = n_traj * steps
    time = pd.date_range("2000-01-01", periods=n, freq="6h")
    lat = np.linspace(-78.75, 78.75, grid[0])
    lon = np.arange(grid[1]) * 360.0 / grid[1]
    # Waves travelling east at a fixed speed, a random phase per trajectory, plus a little noise:
    # learnable dynamics, so a short training run can show its loss falling.
    data = {}
    lon_r, lat_r = np.deg2rad(lon), np.deg2rad(lat)
    step = np.tile(np.arange(steps), n_traj)[:, None, None, None]
    phase = np.repeat(rng.uniform(0, 2 * np.pi, n_traj), steps)[:, None, None, None]
    for i, v in enumerate(VARS):
        lev = np.arange(len(levels))[None, :, None, None]
        wave = np.sin(2 * lon_r[None, None, None, :] - 0.4 * step + phase + 0.5 * lev + i)
        field = 10.0 * wave * np.cos(lat_r)[None, None, :, None] + rng.normal(scale=0.3, size=(n, len(levels), *grid))
        data[v] = (("time", "level", "latitude", "longitude"), (1000.0 * (i + 1) + field).astype(np.float32))
    if with_const:
        data["land_sea_mask"] = (("latitude", "longitude"), (rng.random(grid) > 0.5).astype(np.float32))
    ds = xr.Dataset(data, coords={"time": time, "level": list(levels), "latitude": lat, "longitude": lon,
                                  "trajectory": ("time", np.repeat(np.arange(n_traj), steps))})
    ds.chunk({"time": 1}).to_zarr(path, zarr_format=3, consolidated=False, mode="w")
    dyn = ds[list(VARS)]
    diff = dyn.diff("time").where(xr.DataArray(np.diff(ds.trajectory.values) == 0, dims="time",
                                               coords={"time": ds.time[1:]}))
    stats = {
        "mean": ds.mean(("time", "latitude", "longitude")),
        "std": ds.std(("time", "latitude", "longitude")),
        "diff_mean": diff.mean(("time", "latitude", "longitude")),
        "diff_std": diff.std(("time", "latitude", "longitude")),
    }
    for name, s in stats.items():
        s.drop_vars("trajectory", errors="ignore").to_zarr(path, group=f"stats/{name}", zarr_format=3,
                                                           consolidated=False, mode="w")
    return ds
