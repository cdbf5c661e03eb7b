"""The shallow-water sample: layout, determinism, independent evolving trajectories, correct orientation."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import wxray.data.sample as sample
from wxray.data.sample import VARIABLES, ensure_sample_store, generate_sample
from wxray.data.schema import open_stats, open_store
from wxray.errors import DataError
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


def test_substeps_keep_the_default_and_the_stability_invariant():
    """24 steps of 900 s at 32x64 and 12 at 16x32 as before; finer grids keep w*dt <= C + (dt/tau)/S."""
    assert sample.substeps(32) == 24 and sample.substeps(16) == 12
    for nlat in (32, 64, 128, 256):
        ell, dt = nlat // 2, sample.STEP_S / sample.substeps(nlat)
        w = np.sqrt(sample.GRAVITY * sample.HAVG * ell * (ell - 1)) / sample.RADIUS
        assert w * dt <= sample.COURANT + dt / (sample.HYPERDIFF_TAU * sample.AB3_SLOPE)
    assert sample.substeps(64) > 2 * sample.substeps(32) and sample.substeps(128) > 2 * sample.substeps(64)


def test_an_unstable_integration_stops_at_the_first_non_finite_step(monkeypatch):
    calls = []

    def blown_up(s, u, nsteps):
        calls.append(nsteps)
        return u * float("nan")

    monkeypatch.setattr(sample, "batched_timestep", blown_up)
    with pytest.raises(DataError, match=r"became unstable \(non-finite values at day 0.25 of grid 16x32, seed 1\)"):
        generate_sample(seed=1, **KW)
    assert calls == [sample.substeps(16)]


def _energy(ds: xr.Dataset) -> np.ndarray:
    """Per kept step: area mean of h |v|^2 / 2 + g (h - mean h)^2 / 2 (kinetic + available potential, m3 s-2).

    The scheme conserves energy but for the hyperdiffusion, which only removes it: an unstable mode adds it."""
    w = np.cos(np.radians(ds.latitude.values))[:, None]
    g = sample.GRAVITY
    h = ds.geopotential.values.astype(np.float64) / g
    ke = h * (ds.u_component_of_wind.values.astype(np.float64) ** 2
              + ds.v_component_of_wind.values.astype(np.float64) ** 2) / 2
    hbar = (h * w).sum(axis=(1, 2), keepdims=True) / (w.sum() * h.shape[2])
    return ((ke + g * (h - hbar) ** 2 / 2) * w).sum(axis=(1, 2)) / (w.sum() * h.shape[2])


# The paper's grids, one trajectory each (k = 0) for as many days as the former 900 s * 32/nlat step took to
# raise "became unstable" (non-finite) on it: 64x128 seeds 0 and 2 by day 5, 128x256 seed 0 by day 2 and
# seed 1 by day 3. 64x128 seed 1 (the other seed) survived it, so seed 2 stands in.
@pytest.mark.slow
@pytest.mark.parametrize(("grid", "seed", "days"), [
    pytest.param((64, 128), 0, 4, id="64x128-seed0"), pytest.param((64, 128), 2, 4, id="64x128-seed2"),
    pytest.param((128, 256), 0, 1, id="128x256-seed0", marks=pytest.mark.slow),
    pytest.param((128, 256), 1, 2, id="128x256-seed1", marks=pytest.mark.slow)])
def test_paper_grids_stay_finite_and_bounded(grid, seed, days):
    ds = generate_sample(grid=grid, days=days, seed=seed, trajectories=1, spinup_days=1, progress=False)
    assert ds.attrs["solver"].endswith(f"dt={sample.STEP_S / sample.substeps(grid[0]):.0f}s float64")
    for v in VARIABLES:
        assert np.isfinite(ds[v].values).all(), v
    h = ds.geopotential.values / sample.GRAVITY
    assert 8.0e3 < h.min() and h.max() < 11.5e3  # the layer starts 8.6-10.5 km deep
    wind = np.hypot(ds.u_component_of_wind.values, ds.v_component_of_wind.values)
    assert wind.max() < 90.0  # jets of 20-45 m/s plus eddies; a blow-up passes 150 m/s first
    e = _energy(ds)
    assert e.max() <= 1.01 * e[0], e  # no growth: 1% for float32 fields and a cos-latitude quadrature
