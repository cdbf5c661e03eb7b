"""The shallow-water sample: layout, determinism, independent evolving trajectories, correct orientation."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import wxray.data.sample as sample
from wxray.data.sample import VARIABLES, ensure_sample_store, generate_sample
from wxray.data.schema import open_stats, open_store
from wxray.job import run_job

GRID = (16, 32)
KW = {"grid": GRID, "days": 2, "trajectories": 2, "spinup_days": 1}


@pytest.fixture(scope="module")
def ds() -> xr.Dataset:
    return generate_sample(seed=1, **KW)


def test_layout_and_attrs(ds):
    assert set(ds.data_vars) == set(VARIABLES)
    assert dict(ds.sizes) == {"time": 16, "latitude": 16, "longitude": 32}
    for v in VARIABLES:
        assert ds[v].dims == ("time", "latitude", "longitude") and ds[v].dtype == np.float32
        assert np.isfinite(ds[v].values).all()
    lat = ds.latitude.values
    assert np.all(np.diff(lat) > 0) and lat[0] == -90.0 and lat[-1] == 90.0
    np.testing.assert_allclose(lat, -lat[::-1])
    np.testing.assert_allclose(ds.longitude.values, np.arange(32) * 360 / 32)
    assert ds.trajectory.dims == ("time",) and ds.trajectory.values.tolist() == [0] * 8 + [1] * 8
    dt = np.diff(ds.time.values)
    assert np.all(dt == np.timedelta64(6, "h")) and str(ds.time.values[0])[:13] == "2000-01-01T00"
    assert "NOT ERA5" in ds.attrs["source"] and "shallow-water" in ds.attrs["source"]
    g = ds.geopotential.values
    assert 8e4 < g.mean() < 1.1e5  # g * h around g * 10 km


def test_deterministic_for_a_seed(ds):
    again = generate_sample(seed=1, **KW)
    for v in VARIABLES:
        np.testing.assert_array_equal(again[v].values, ds[v].values)
    other = generate_sample(seed=2, **KW)
    assert not np.allclose(other.geopotential.values, ds.geopotential.values)


def test_trajectories_differ_and_the_flow_evolves(ds):
    z = ds.geopotential.values
    t0, t1 = z[:8], z[8:]
    assert np.abs(t0 - t1).mean() > 0.1 * z.std()
    for v in VARIABLES:
        x = ds[v].values
        step = np.abs(np.diff(x, axis=0)).mean(axis=(1, 2))
        assert np.all(step > 1e-3 * x.std()), v  # every consecutive pair differs


def test_latitude_orientation_matches_the_dynamics(ds):
    """Zonal-mean relative vorticity = -1/(R cos phi) d(u cos phi)/d phi on the store's own latitudes.

    A north/south flip of the fields relative to the latitude coordinate reverses the sign."""
    r_earth = 6.37122e6
    phi = np.radians(ds.latitude.values)
    u = ds.u_component_of_wind.values.astype(np.float64).mean(axis=2)
    zeta = ds.vorticity.values.astype(np.float64).mean(axis=2)
    dudphi = np.gradient(u * np.cos(phi), phi, axis=1)
    inner = slice(2, -2)
    est = -dudphi[:, inner] / (r_earth * np.cos(phi[inner]))
    corr = np.corrcoef(est.ravel(), zeta[:, inner].ravel())[0, 1]
    assert corr > 0.9, corr


def test_job_writes_store_with_stats(sample_job, tmp_path, capsys):
    out = tmp_path / "sample.zarr"
    rc = run_job("make_sample_data", sample_job.SampleDataConfig, sample_job.main,
                 [f"out={out}", "grid=16x32", "days=1", "trajectories=2", "spinup_days=1", "seed=3",
                  f"out_dir={tmp_path / 'run'}", "tracking.enabled=false"])
    assert rc == 0, capsys.readouterr().err
    assert '"n_times": 8' in capsys.readouterr().out
    store = open_store(out)
    assert store.trajectory.values.tolist() == [0] * 4 + [1] * 4
    stats = open_stats(out)
    z = store.geopotential.values.astype(np.float64)
    d = np.concatenate([np.diff(z[:4], axis=0), np.diff(z[4:], axis=0)])  # never across trajectories
    np.testing.assert_allclose(stats.diff_std.geopotential.values, d.std(), rtol=1e-6)
    np.testing.assert_allclose(stats.mean.vorticity.values, store.vorticity.values.astype(np.float64).mean(),
                               rtol=1e-6)
    assert stats.climatology.geopotential.dims == ("dayofyear", "hour", "latitude", "longitude")


def test_bad_grid_is_a_config_error(sample_job, tmp_path, capsys):
    rc = run_job("make_sample_data", sample_job.SampleDataConfig, sample_job.main,
                 [f"out={tmp_path / 's.zarr'}", "grid=31x64", f"out_dir={tmp_path / 'run'}",
                  "tracking.enabled=false"])
    assert rc == 2 and "config key 'grid'" in capsys.readouterr().err
    assert not (tmp_path / "s.zarr").exists()


def test_ensure_sample_store_generates_once(tmp_path, monkeypatch):
    path = tmp_path / "data" / "sample.zarr"
    assert ensure_sample_store(path, grid=GRID, days=1, seed=0, trajectories=2) == path
    first = open_store(path).geopotential.values

    def boom(*a, **k):
        raise AssertionError("must not regenerate an existing store")

    monkeypatch.setattr(sample, "make_sample_store", boom)
    assert ensure_sample_store(path, grid=GRID, days=1, seed=0, trajectories=2) == path
    np.testing.assert_array_equal(open_store(path).geopotential.values, first)
    assert open_stats(path).std.geopotential.values > 0


def test_batched_stepper_matches_the_solver():
    """The batch integration gives what ShallowWaterSolver.timestep gives for each state alone."""
    import torch

    s, n_sub = sample._solver(*GRID)
    states = [sample._initial_state(s, np.random.default_rng([5, k])) for k in range(2)]
    with torch.no_grad(), sample._one_thread():
        batch = sample.batched_timestep(s, torch.stack(states), n_sub)
        for k in range(2):
            alone = s.timestep(states[k], n_sub)
            scale = alone.abs().max()
            assert ((batch[k] - alone).abs().max() / scale).item() < 1e-12
            assert ((alone - states[k]).abs().max() / scale).item() > 1e-6  # it did integrate


def test_store_opens_in_plain_xarray_without_warnings(tmp_path):
    import warnings

    path = tmp_path / "s.zarr"
    sample.make_sample_store(path, grid=GRID, days=1, trajectories=1, spinup_days=1, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. the RuntimeWarning about missing consolidated metadata
        ds = xr.open_zarr(path)
        clim = xr.open_zarr(path, group="stats/climatology")
    assert set(ds.data_vars) == set(VARIABLES) and "geopotential" in clim
