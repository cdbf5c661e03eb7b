"""Autoregressive rollout: de/normalisation and the history shift checked against persistence, per-lead
scores (RMSE, ACC, persistence), routing draws as an ensemble, the forecast store."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import xarray as xr

from wxray.data.schema import open_climatology, open_stats, open_store
from wxray.data.stats import add_stats
from wxray.data.windows import WindowConfig, make_spec
from wxray.errors import DataError
from wxray.forecast.rollout import check_rollout, possible_steps, rollout, to_forecast_dataset, write_forecast
from wxray.forecast.seeds import DROPOUT, ENCODER, ROUTING, coordinate_seed
from wxray.models.batch_invariance import batch_invariant
from wxray.models.compiled import compile_forecaster
from wxray.models.registry import ModelConfig, build_forecaster
from wxray.verify.lead_scores import rollout_report, score_per_lead
from wxray.verify.spatial import latitude_weights


class ZeroTendency(torch.nn.Module):
    """Predicts 'no change': the normalised tendency whose physical value is exactly 0."""

    def __init__(self, spec):
        super().__init__()
        self.value = torch.as_tensor(-spec.out_mean / spec.out_std)[None, :, None, None]

    def forward(self, x, generator=None):
        return self.value.expand(x.shape[0], -1, *x.shape[-2:]).clone()


class Shift(torch.nn.Module):
    """Outputs the normalised input channel of the *previous* step: exposes a wrong history shift."""

    def __init__(self, spec):
        super().__init__()
        self.spec = spec

    def forward(self, x, generator=None):
        v = len(self.spec.inputs)
        prev = x[:, :v] * torch.as_tensor(self.spec.in_std)[None, :, None, None] \
            + torch.as_tensor(self.spec.in_mean)[None, :, None, None]
        last = x[:, v: 2 * v] * torch.as_tensor(self.spec.in_std)[None, :, None, None] \
            + torch.as_tensor(self.spec.in_mean)[None, :, None, None]
        tendency = prev - last  # next state = the state one step before the last
        return (tendency - torch.as_tensor(self.spec.out_mean)[None, :, None, None]) \
            / torch.as_tensor(self.spec.out_std)[None, :, None, None]


def test_zero_tendency_rollout_is_persistence_and_scores_match(tiny_store):
    path, ds = tiny_store
    store = open_store(path)
    spec = make_spec(str(path), store, open_stats(path), WindowConfig(history=2, lead_steps=1, residual=True))
    anchors = np.array([3, 15, 27])
    fc = rollout(ZeroTendency(spec), spec, anchors, steps=3)
    z = ds.geopotential.sel(level=850).values
    ch = [c.name for c in spec.targets].index("geopotential_850")
    for k in range(3):
        np.testing.assert_allclose(fc[:, k, ch], z[anchors], rtol=1e-5)
    forecast = to_forecast_dataset(fc, spec, store, anchors)
    assert forecast["lead_time"].values.astype("timedelta64[h]").astype(int).tolist() == [6, 12, 18]
    scores = score_per_lead(forecast, store)
    w = np.cos(np.deg2rad(ds.latitude.values))
    for k in range(3):
        err = (z[anchors] - z[anchors + k + 1]) ** 2
        expected = np.sqrt(np.mean([np.average(e.mean(-1), weights=w) for e in err]))
        np.testing.assert_allclose(scores["rmse"]["geopotential_850"][k], expected, rtol=0.02)


def test_history_shifts_by_one_step_each_lead(tiny_store):
    path, ds = tiny_store
    store = open_store(path)
    spec = make_spec(str(path), store, open_stats(path), WindowConfig(history=2, lead_steps=1, residual=True,
                                                                       constants=["land_sea_mask"]))
    a = np.array([5])
    fc = rollout(Shift(spec), spec, a, steps=3)
    z = ds.temperature.sel(level=500).values
    ch = [c.name for c in spec.targets].index("temperature_500")
    # states: s4, s5 -> s4 -> s5 -> s4 (each prediction repeats the state before the last)
    np.testing.assert_allclose(fc[0, 0, ch], z[4], rtol=1e-5)
    np.testing.assert_allclose(fc[0, 1, ch], z[5], rtol=1e-5)
    np.testing.assert_allclose(fc[0, 2, ch], z[4], rtol=1e-5)


def _with_climatology(path):
    add_stats(path, clim_window_days=3, progress=False)  # stats/* incl. climatology, by the data layer
    return open_store(path)


def test_report_scores_acc_and_persistence_per_lead(tiny_store):
    path, ds = tiny_store
    store = _with_climatology(path)
    spec = make_spec(str(path), store, open_stats(path), WindowConfig(history=2, lead_steps=1, residual=True))
    anchors = np.array([3, 4, 15, 27])
    forecast = to_forecast_dataset(rollout(ZeroTendency(spec), spec, anchors, steps=2), spec, store, anchors)
    clim = open_climatology(path)
    report = rollout_report(forecast, store, clim)
    assert report["lead_hours"] == [6, 12] and report["inits"] == 4 and report["members"] == 1
    channels = [c.name for c in spec.targets]
    for key in ("rmse", "acc", "persistence_rmse", "persistence_acc"):
        assert sorted(report[key]) == sorted(channels) and all(len(v) == 2 for v in report[key].values())
    # A zero-tendency model *is* persistence: the two rows agree, and the forecast's ACC is WB2's.
    for ch in channels:
        np.testing.assert_allclose(report["rmse"][ch], report["persistence_rmse"][ch], rtol=1e-5)
        np.testing.assert_allclose(report["acc"][ch], report["persistence_acc"][ch], rtol=1e-5)
    w = latitude_weights(ds.latitude.values).values[:, None]
    times = store.time.values
    c = clim.geopotential.sel(level=500)
    accs = []
    for a in anchors:
        valid = times[a + 2]
        cv = c.sel(dayofyear=valid.astype("datetime64[D]").item().timetuple().tm_yday,
                   hour=int(str(valid)[11:13])).values
        f, t = ds.geopotential.sel(level=500).values[a] - cv, ds.geopotential.sel(level=500).values[a + 2] - cv
        accs.append((w * f * t).mean() / np.sqrt((w * f * f).mean() * (w * t * t).mean()))
    np.testing.assert_allclose(report["acc"]["geopotential_500"][1], np.mean(accs), rtol=1e-4)
    assert report["units"] == dict.fromkeys(channels, "")  # the tiny store has no units attrs


def test_report_without_climatology_has_no_acc(tiny_store):
    path, _ = tiny_store
    store = open_store(path)
    spec = make_spec(str(path), store, open_stats(path), WindowConfig(history=2, lead_steps=1, residual=True))
    anchors = np.array([3, 15])
    forecast = to_forecast_dataset(rollout(Shift(spec), spec, anchors, steps=1), spec, store, anchors)
    report = rollout_report(forecast, store, open_climatology(path))
    assert "acc" not in report and "persistence_acc" not in report and "rmse" in report


def _tiny_model(spec):
    torch.manual_seed(0)
    return build_forecaster(ModelConfig(embed_dim=16, depth=3, num_heads=2, split=(1, 1, 1), keep_ratio=0.5,
                                        skip_channels=8), spec)


def _spy_on_draws(model) -> list:
    """Record every per-sample token selection of `model` (in call order)."""
    selector, calls = model.router.selector, []
    select = selector.select

    def spy(x, k, generator=None, context=None):
        calls.append(select(x, k, generator, context))
        return calls[-1]

    selector.select = spy
    return calls


def test_routing_members_are_own_draws_and_recompute_alone(tiny_store):
    path, _ = tiny_store
    store = open_store(path)
    spec = make_spec(str(path), store, open_stats(path), WindowConfig(history=2, lead_steps=1, levels=[500]))
    model = _tiny_model(spec)
    draws = _spy_on_draws(model)
    anchors = np.array([3, 15])
    fc = rollout(model, spec, anchors, steps=2, seed=7, members=[0, 1, 2], batch_size=1)
    assert fc.shape == (2, 3, 2, 2, 8, 16)
    one_by_one = [draws[2 * s: 2 * s + 2] for s in range(6)]  # sample s = (init s // 3, member s % 3), 2 steps
    assert not torch.equal(one_by_one[0][0], one_by_one[1][0]) and not np.array_equal(fc[:, 0], fc[:, 1])
    # Member 2 of init 15 recomputed alone: the same draws, the same forecast bit for bit.
    draws.clear()
    alone = rollout(model, spec, anchors[1:], steps=2, seed=7, members=[2], batch_size=1)
    assert all(torch.equal(a, b) for a, b in zip(draws, one_by_one[5], strict=True))
    assert np.array_equal(alone[0, 0], fc[1, 2])
    # All six samples in one batch: every sample still draws from its own generator.
    draws.clear()
    batched = rollout(model, spec, anchors, steps=2, seed=7, members=[0, 1, 2], batch_size=6)
    assert all(torch.equal(draws[6 * k + s], one_by_one[s][k]) for s in range(6) for k in range(2))
    assert np.array_equal(batched, fc)  # batched members, bit for bit (CPU: models/batch_invariance.py)
    plain = rollout(model, spec, anchors, steps=2, seed=7)
    assert np.array_equal(plain, fc[:, 0])  # the deterministic forecast is member 0
    assert not np.array_equal(rollout(model, spec, anchors, steps=2, seed=8), plain)


@pytest.mark.slow  # tracing a forecaster on 2 cores: make test, not test-fast
def test_a_compiled_rollout_draws_and_forecasts_as_the_eager_one(tiny_store):
    path, _ = tiny_store
    store = open_store(path)
    spec = make_spec(str(path), store, open_stats(path), WindowConfig(history=2, lead_steps=1, levels=[500]))
    model, anchors = _tiny_model(spec), np.array([3, 15])
    eager = rollout(model, spec, anchors, steps=2, seed=7, members=[0, 1, 2], batch_size=6)
    compiled = compile_forecaster(model, "default", backend="aot_eager")
    assert compiled is not model
    batched = rollout(compiled, spec, anchors, steps=2, seed=7, members=[0, 1, 2], batch_size=6)
    alone = rollout(compiled, spec, anchors[1:], steps=2, seed=7, members=[2], batch_size=1)
    assert np.array_equal(batched, eager)  # the same draws and the same kernels (CPU): the same bits
    assert np.array_equal(alone[0, 0], batched[1, 2])  # a member recomputed alone, compiled


def test_the_one_seed_scheme():
    """Every draw's seed comes from its coordinates: a forecaster's member m is (m,), a nested ensemble's draws
    (source, i, j, k); the same function for both (forecast/seeds.py)."""
    t = np.datetime64("2000-01-01T06:00:00.000000000")
    expected = np.random.SeedSequence([3, 946706400, 1]).generate_state(1, np.uint64)[0]
    assert coordinate_seed(3, t, 1) == int(expected)
    seeds = {coordinate_seed(3, t, m) for m in range(4)} | {coordinate_seed(3, t + np.timedelta64(6, "h"), 0)}
    assert len(seeds) == 5
    assert coordinate_seed(0, np.datetime64("1950-01-01T00"), 0) >= 0  # before 1970: still a valid seed
    nested = {coordinate_seed(3, t, ENCODER, 0), coordinate_seed(3, t, DROPOUT, 0, 0),
              coordinate_seed(3, t, ROUTING, 0, 0, 0), coordinate_seed(3, t, ROUTING)}
    assert len(nested) == 4 and coordinate_seed(3, t, ENCODER, 1) == int(
        np.random.SeedSequence([3, 946706400, ENCODER, 1]).generate_state(1, np.uint64)[0])


def test_forecast_store_has_members_units_and_consolidated_metadata(tiny_store, tmp_path):
    path, _ = tiny_store
    store = open_store(path)
    spec = make_spec(str(path), store, open_stats(path), WindowConfig(history=2, lead_steps=1, levels=[500]))
    anchors = np.array([3, 15])
    fc = rollout(_tiny_model(spec), spec, anchors, steps=2, members=[0, 1, 2])
    ds = to_forecast_dataset(fc, spec, store, anchors, members=[0, 1, 2])
    write_forecast(ds, tmp_path / "forecast.zarr")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "consolidated metadata missing" RuntimeWarning
        back = xr.open_zarr(tmp_path / "forecast.zarr")
    assert back.geopotential.dims == ("init_time", "lead_time", "member", "level", "latitude", "longitude")
    assert back.sizes["member"] == 3 and back.attrs["routing_members"] == 3
    np.testing.assert_array_equal(back.geopotential.isel(member=1, level=0).values, fc[:, 1, :, 0])


def test_one_rule_says_how_far_a_forecast_is_fed_back(tiny_store):
    """`check_rollout` (the forecast job) and `possible_steps` (the evaluation after training) share it."""
    path, _ = tiny_store
    store, stats = open_store(path), open_stats(path)
    cases = [  # WindowConfig, why not beyond one step (None: any number of steps)
        ({"history": 2, "lead_steps": 1}, None),
        ({"history": 1, "lead_steps": 2}, None),
        ({"history": 2, "lead_steps": 2}, "needs lead_steps = 1"),
        ({"target_variables": ["geopotential"]}, "needs the targets to be the input variables"),
    ]
    for kw, why in cases:
        spec = make_spec(str(path), store, stats, WindowConfig(**kw))
        assert possible_steps(spec, 4) == (4 if why is None else 1) and possible_steps(spec, 0) == 0, kw
        check_rollout(spec, 1)
        if why is None:
            check_rollout(spec, 4)
        else:
            with pytest.raises(ValueError, match=why):
                check_rollout(spec, 4)


def test_a_forecast_on_part_of_the_grid_is_scored_on_its_points(tiny_store):
    """Truth, persistence and climatology are cut to the forecast's rows and columns (verify's crop_to);
    a forecast whose points are not a block of the store grid is a one-line DataError."""
    path, _ = tiny_store
    store = _with_climatology(path)
    spec = make_spec(str(path), store, open_stats(path), WindowConfig(history=2, lead_steps=1, levels=[500]))
    anchors = np.array([3, 15])
    full = to_forecast_dataset(rollout(_tiny_model(spec), spec, anchors, steps=2), spec, store, anchors)
    block = {"latitude": slice(1, 6), "longitude": slice(3, 11)}
    clim = open_climatology(path)
    report = rollout_report(full.isel(block), store, clim)
    assert set(report) >= {"rmse", "acc", "persistence_rmse", "persistence_acc"}
    assert report == rollout_report(full.isel(block), store.isel(block), clim.isel(block))
    shifted = full.assign_coords(latitude=full.latitude.values + 1.0)
    with pytest.raises(DataError, match="^store: grid 8x16 does not contain the points of the 8x16 grid"):
        rollout_report(shifted, store, clim)


def test_batch_invariance_switches_onednn_off_for_the_cpu_only_and_restores_it():
    before = torch.backends.mkldnn.enabled
    with batch_invariant("cpu"):
        assert torch.backends.mkldnn.enabled is False
    assert torch.backends.mkldnn.enabled == before
    with batch_invariant("cuda"):  # a no-op off the CPU: cuBLAS/cuDNN have no such switch
        assert torch.backends.mkldnn.enabled == before
    with pytest.raises(RuntimeError), batch_invariant("cpu"):
        raise RuntimeError("a failed forward")
    assert torch.backends.mkldnn.enabled == before


def test_batch_invariance_holds_for_convolutions_of_16_members():
    """From a batch of 16 a CPU convolution goes to NNPACK, whose tiling depends on the batch: off, like oneDNN."""
    torch.manual_seed(0)
    conv, x = torch.nn.Conv2d(8, 3, 3, padding=1), torch.randn(16, 8, 8, 16)
    with torch.no_grad(), batch_invariant("cpu"):
        assert torch.equal(conv(x), torch.cat([conv(x[i: i + 1]) for i in range(16)]))
