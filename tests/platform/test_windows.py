from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from tests.tiny_store import write_tiny_store
from wxray.data.anchors import split_anchors, valid_anchors
from wxray.data.schema import open_stats, open_store
from wxray.data.windows import WindowConfig, WindowReader, make_spec, to_physical
from wxray.errors import ConfigError, DataError


def test_valid_anchors_never_straddle_trajectories(tiny_store):
    path, ds = tiny_store
    a = valid_anchors(open_store(path), history=2, lead_steps=3)
    traj = ds.trajectory.values
    assert len(a) == 3 * (12 - 4)  # per trajectory: steps - (H - 1 + lead)
    for t in a:
        assert len(set(traj[t - 1: t + 4])) == 1


def test_gap_in_time_breaks_windows(tmp_path):
    from tests.tiny_store import write_tiny_store

    ds = write_tiny_store(tmp_path / "a.zarr", n_traj=1, steps=10)
    gappy = ds.drop_vars("trajectory").isel(time=[0, 1, 2, 3, 5, 6, 7, 8, 9])
    gappy.to_zarr(tmp_path / "g.zarr", zarr_format=3, consolidated=False)
    a = valid_anchors(open_store(tmp_path / "g.zarr"), history=2, lead_steps=1)
    times = gappy.time.values
    for t in a:
        assert np.all(np.diff(times[t - 1: t + 2]) == np.timedelta64(6, "h"))
    assert a.tolist() == [1, 2, 5, 6, 7]  # anchors 3 and 4 would span the 3 -> 5 gap


def test_splits_are_disjoint_in_time(tiny_store):
    path, _ = tiny_store
    ds = open_store(path)
    cfg = WindowConfig(history=2, lead_steps=1)
    a = valid_anchors(ds, 2, 1)
    s = split_anchors(ds, a, cfg)
    times = ds.time.values
    spans = {k: (times[v - 1].min(), times[v + 1].max()) for k, v in s.items() if len(v)}
    assert spans["train"][1] < spans["val"][0] and spans["val"][1] < spans["test"][0]
    assert sum(len(v) for v in s.values()) <= len(a)
    ranged = split_anchors(ds, a, WindowConfig(train_range="2000-01-01/2000-01-03T18",
                                                val_range="2000-01-04/2000-01-09"))
    assert len(ranged["train"]) > 0 and len(ranged["test"]) == 0
    with pytest.raises(ConfigError, match="data.val_range"):
        split_anchors(ds, a, WindowConfig(val_range="yesterday"))


def test_reader_normalises_and_residual_round_trips(tiny_store):
    path, ds = tiny_store
    cfg = WindowConfig(history=2, lead_steps=2, residual=True, levels=[500])
    spec = make_spec(str(path), open_store(path), open_stats(path), cfg)
    assert [c.name for c in spec.inputs] == ["geopotential_500", "temperature_500"]
    assert spec.constants == ["land_sea_mask"]
    out = WindowReader(spec)({"anchor": np.array([5, 20])})
    assert out["x"].shape == (2, 2 * 2 + 1, 8, 16) and out["y"].shape == (2, 2, 8, 16)
    # history-major: channel 0 is geopotential_500 at t-1, channel 2 at t
    z = ds.geopotential.sel(level=500).values
    np.testing.assert_allclose(out["x"][0, 2] * spec.in_std[0] + spec.in_mean[0], z[5], rtol=1e-5)
    np.testing.assert_allclose(out["x"][0, 0] * spec.in_std[0] + spec.in_mean[0], z[4], rtol=1e-5)
    phys = to_physical(spec, out["y"], out["x"])
    np.testing.assert_allclose(phys[1, 0], z[22], rtol=1e-5)


def test_missing_variable_is_named(tiny_store):
    path, _ = tiny_store
    with pytest.raises(DataError, match="variable '2m_temperature' not found"):
        make_spec(str(path), open_store(path), open_stats(path), WindowConfig(input_variables=["2m_temperature"]))
    with pytest.raises(DataError, match="no level \\[300\\]"):
        make_spec(str(path), open_store(path), open_stats(path), WindowConfig(levels=[300]))


def test_levels_apply_to_inputs_and_targets_together(tmp_path):
    """A surface-only target list beside upper-air inputs is a legitimate config with data.levels."""
    path = tmp_path / "s.zarr"
    ds = write_tiny_store(path, n_traj=1, steps=6, levels=(500,))
    surface = ds.temperature.isel(level=0, drop=True).rename("2m_temperature").to_dataset()
    surface.chunk({"time": 1}).to_zarr(path, mode="a", consolidated=False)
    stats = xr.Dataset({"2m_temperature": ((), 1.0)})
    for g in ("mean", "std", "diff_mean", "diff_std"):
        stats.to_zarr(path, group=f"stats/{g}", mode="a", consolidated=False)
    cfg = WindowConfig(input_variables=["geopotential", "2m_temperature"], target_variables=["2m_temperature"],
                       levels=[500], residual=False)
    spec = make_spec(str(path), open_store(path), open_stats(path), cfg)
    assert [c.name for c in spec.inputs] == ["geopotential_500", "2m_temperature"]
    assert [c.name for c in spec.targets] == ["2m_temperature"]
    with pytest.raises(DataError, match="levels=.500. asked for but no requested variable has pressure levels"):
        make_spec(str(path), open_store(path), open_stats(path),
                  WindowConfig(input_variables=["2m_temperature"], levels=[500]))
