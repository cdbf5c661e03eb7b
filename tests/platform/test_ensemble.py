"""Batch ensembles on Ray actors: common random numbers, stores written by coordinate, resume, the split."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
import xarray as xr

from wxray.config import load_config
from wxray.data.e2e_windows import E2EReader, prepare_e2e
from wxray.data.schema import TIME, open_store
from wxray.errors import ConfigError, WxrayError
from wxray.forecast.nested import Plan, UnitModels, run_unit
from wxray.forecast.stages import build_encoder
from wxray.forecast.workers import WorkersConfig
from wxray.models import StochasticEncoder
from wxray.models.registry import build_forecaster
from wxray.platform.cluster.replicas import actor_capacity
from wxray.platform.ensemble.actors import fan_out
from wxray.platform.ensemble.store import DONE, EnsembleStore, Layout
from wxray.platform.train.stage_config import TrainE2EConfig
from wxray.verify.anova import nested_anova
from wxray.verify.variance import split_members, split_moments

TINY = ["encoder.hidden=8", "encoder.embed_dim=16", "encoder.depth=1", "encoder.num_heads=2", "encoder.patch_size=2",
        "processor.embed_dim=16", "processor.depth=3", "processor.split=[1,1,1]", "processor.num_heads=2",
        "processor.skip_channels=8", "processor.patch_size=2"]


@pytest.fixture(scope="module")
def setup(small_store, small_obs):
    """Untrained tiny models on the small store: an encoder whose noise matters, a routing processor."""
    cfg = load_config(TrainE2EConfig, [f"data.store={small_store}", f"data.obs_dir={small_obs.obs_dir}", *TINY])
    data = prepare_e2e(cfg.data, cfg.encoder.patch_size)
    torch.manual_seed(0)
    senc = StochasticEncoder(build_encoder(cfg, data), noise="film", noise_dim=4)
    with torch.no_grad():  # off the zero-initialised FiLM point, so the noise draw changes the analysis
        for p in senc.parameters():
            if not p.abs().sum():
                p.normal_(0.0, 0.3)
    processor = build_forecaster(cfg.processor, data.spec)
    anchors = np.arange(2, 4)
    times = open_store(data.spec.store)[TIME].values[anchors]
    return cfg, data, senc, processor, anchors, times


def _models(setup, noise=True, routing=True):
    cfg, data, senc, processor, *_ = setup
    if not noise:
        senc = StochasticEncoder(build_encoder(cfg, data), noise="film", noise_dim=4)  # zero FiLM: noise inert
    if not routing:
        processor.router.selector.deterministic = True  # one fixed selection (eval mode)
    return UnitModels(data.spec, senc, processor)


def _layout(setup, plan) -> Layout:
    _, data, *_, times = setup
    return Layout(plan, data.spec, times, np.timedelta64(6, "h"), attrs={"test": "1"})


def _run(setup, plan, out, actors=1, kill=False, write=None, denied: Plan | None = None, collect=None):
    """fan_out into a store under `out`; with `kill`, actor 0 is killed once the first unit is in (mid-run:
    the units in flight on it are retried on its restarted replica). With `denied`, a second run with that plan
    shares the fan-out, init by init; with `collect`, every unit's members also land in `collect[run, a, i]`."""
    _, data, *_, anchors, times = setup
    layout = _layout(setup, plan)
    store = EnsembleStore(out, layout)
    done = store.open()
    runs = [plan] + ([denied] if denied else [])
    units = [(r, a, i) for a in range(len(anchors)) for r in range(len(runs)) for i in range(plan.members_m)
             if r or (a, i) not in done]
    reader = E2EReader(data.spec, data.obs)
    handles, calls = [], []

    def progress(n):
        calls.append(n)
        if kill and len(calls) == 1:
            import ray

            ray.kill(handles[0], no_restart=False)

    def put(r, a, i, unit):
        if collect is not None:
            collect[r, a, i] = unit["fields"]
        if not r:
            (write or store.write)(a, i, unit)

    fan_out(_models(setup), runs, units, times, lambda a: reader.inputs(anchors[[a]]), put,
            workers=WorkersConfig(actors=actors, num_cpus=1, device="cpu"), on_started=handles.extend,
            progress=progress)
    return store.finish()


def _interrupted(setup, plan, out, after: int) -> list[tuple[int, int]]:
    """A two-actor run into `out` whose writer fails after `after` units: the units it wrote."""
    store = EnsembleStore(out, _layout(setup, plan))
    store.open()
    calls = []

    def failing(a, i, unit):
        if len(calls) == after:
            raise RuntimeError("interrupted")
        calls.append((a, i))
        store.write(a, i, unit)

    with pytest.raises(RuntimeError, match="interrupted"):
        _run(setup, plan, out, actors=2, write=failing)
    return calls


def _unit_members(setup, plan, models, i=None):
    """Members (encoder_draw, lead, N, R, V, h, w) of init 0 computed in this process, unit by unit."""
    _, data, *_, anchors, times = setup
    models.prepare(plan.dropout)
    inputs = E2EReader(data.spec, data.obs).inputs(anchors[:1])
    draws = range(plan.members_m) if i is None else [i]
    return np.stack([run_unit(models, inputs, times[0], k, plan)["fields"] for k in draws])


def _anova(fields: np.ndarray, lead: int, clip=True):
    dims = ("encoder_draw", "dropout_draw", "channel", "y", "x")
    da = xr.DataArray(fields[:, lead, :, 0].astype(np.float64), dims=dims)
    return nested_anova(da, clip=clip)


@pytest.mark.slow  # actors killed and restarted: multi-process Ray, as the other slow tests
def test_actors_kill_and_resume_give_the_same_members_and_moments_the_same_split(ray_session, setup, tmp_path,
                                                                                    monkeypatch):
    from wxray.platform.ensemble import store as ensemble_store

    plan = Plan(members_m=3, members_n=2, members_r=2, lead_steps=2, seed=7, dropout=0.2)
    # one actor, and a run denying a stream in the same fan-out (as jobs/ose.py runs them): each run's members
    # are those of its units computed alone, in this process
    runs = (plan, replace(plan, deny=(setup[1].obs.streams[0].name,)))
    got = {}
    one = _run(setup, plan, tmp_path / "one", actors=1, denied=runs[1], collect=got)
    ref = xr.open_zarr(one["fields"]).load()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the actors run
    try:
        for r, run in enumerate(runs):
            alone = _unit_members(setup, run, _models(setup))  # init 0
            for i in range(3):
                np.testing.assert_array_equal(got[r, 0, i], alone[i])
    finally:
        torch.set_num_threads(threads)
    assert not np.allclose(got[0, 0, 0], got[1, 0, 0])
    with pytest.raises(ValueError, match="differ only in their denied streams"):
        fan_out(_models(setup), [plan, replace(plan, seed=8)], [(0, 0, 0)], setup[-1], None, None,
                workers=WorkersConfig(actors=1))
    assert ref.geopotential.dims[:5] == ("init_time", "lead_time", "encoder_draw", "dropout_draw", "routing_draw")
    assert int(ref.geopotential.isnull().sum()) == 0 and not (tmp_path / "one" / DONE).exists()
    assert xr.open_zarr(one["fields"]).geopotential.encoding["chunks"][:3] == (1, 3, 1)  # a unit, all leads

    # chunks too big for CHUNK_BYTES (ERA5 grids) are cut along the leads; the values do not change
    with monkeypatch.context() as m:
        m.setattr(ensemble_store, "CHUNK_BYTES", 1)
        killed = _run(setup, plan, tmp_path / "killed", actors=2, kill=True)
    assert xr.open_zarr(killed["fields"]).geopotential.encoding["chunks"][:3] == (1, 1, 1)
    xr.testing.assert_identical(xr.open_zarr(killed["fields"]).load(), ref)

    # a run that fails after three units keeps them; the re-run computes only the other three
    layout = _layout(setup, plan)
    calls = _interrupted(setup, plan, tmp_path / "resumed", after=3)
    assert (tmp_path / "resumed" / DONE).exists() and not (tmp_path / "resumed" / "forecast.zarr").exists()
    written = []
    store2 = EnsembleStore(tmp_path / "resumed", layout)
    assert store2.open() == set(calls)
    resumed = _run(setup, plan, tmp_path / "resumed", actors=2, write=lambda a, i, u: (written.append((a, i)),
                                                                                     store2.write(a, i, u)))
    assert len(written) == 3 and not set(written) & set(calls)
    xr.testing.assert_identical(xr.open_zarr(resumed["fields"]).load(), ref)

    # a finished run is not computed again
    again = []
    _run(setup, plan, tmp_path / "one", write=lambda a, i, u: again.append((a, i)))
    assert again == [] and xr.open_zarr(one["fields"]).load().identical(ref)

    # streamed moments, interrupted after four units and resumed: only whole inits count as written (a unit is
    # never merged twice), and the split equals the stored members'
    mplan = Plan(**{**plan.__dict__, "keep_members": False})
    monkeypatch.setattr(ensemble_store, "CHUNK_BYTES", 1)  # and a lead per chunk
    _interrupted(setup, mplan, tmp_path / "moments", after=4)
    kept = EnsembleStore(tmp_path / "moments", _layout(setup, mplan)).open()
    assert kept == {(a, k) for a, _ in kept for k in range(3)} and len(kept) < 6
    moments = _run(setup, mplan, tmp_path / "moments", actors=2)
    assert moments["fields"].name == "moments.zarr"
    streamed = split_moments(xr.open_zarr(moments["fields"]).load(), n=2, r=2)["geopotential"]
    stored = split_members(ref)["geopotential"]
    for key in ("u_enc", "u_drop", "u_route", "u_total", "mean"):
        np.testing.assert_allclose(streamed[key].values, stored[key].values, rtol=1e-5, atol=1e-9)
    assert float(stored["u_route"].isel(lead_time=1).mean()) > 0  # the routing draws add spread


def test_dropout_off_leaves_only_the_encoder_draws(setup):
    plan = Plan(members_m=3, members_n=2, members_r=1, lead_steps=1, seed=1, dropout=0.0)
    fields = _unit_members(setup, plan, _models(setup, routing=False))
    split = _anova(fields, lead=1)
    assert float(abs(split["u_drop"]).max()) == 0.0
    var_draws = fields[:, 1, 0, 0].astype(np.float64).var(axis=0, ddof=1)  # dropout members equal: one per draw
    np.testing.assert_allclose(split["u_enc"].values, var_draws, rtol=1e-5, atol=1e-6)
    assert float(split["u_enc"].mean()) > 0


def test_encoder_noise_off_leaves_only_the_dropout_members(setup):
    plan = Plan(members_m=3, members_n=4, members_r=1, lead_steps=1, seed=2, dropout=0.3)
    fields = _unit_members(setup, plan, _models(setup, noise=False, routing=False))
    assert (fields[:, 0] == fields[:1, 0]).all()  # one analysis for every draw
    raw, clipped = _anova(fields, lead=1, clip=False), _anova(fields, lead=1)
    # no encoder variance: the unbiased estimate scatters around 0, the dropout part carries the spread
    assert abs(float(raw["u_enc"].mean())) < 0.1 * float(raw["u_drop"].mean())
    assert float(clipped["rho_drop"].mean()) > 0.7


def test_a_unit_alone_is_bit_identical_and_draws_follow_coordinates(setup):
    plan = Plan(members_m=2, members_n=2, members_r=2, lead_steps=1, seed=3, dropout=0.2)
    models = _models(setup)
    both = _unit_members(setup, plan, models)
    np.testing.assert_array_equal(_unit_members(setup, plan, models, i=1)[0], both[1])
    assert not np.allclose(both[0], both[1])  # encoder draws differ
    other = _unit_members(setup, Plan(**{**plan.__dict__, "seed": 4}), models)
    assert not np.allclose(other, both)


def test_actor_capacity_and_requests_no_cluster_meets(ray_session):
    nodes = [{"CPU": 16.0, "GPU": 4.0}, {"CPU": 8.0}]
    assert actor_capacity(nodes, 1, 0) == 24
    assert actor_capacity(nodes, 2, 0.5) == 8  # GPU-bound on the first node, none on the second
    assert actor_capacity(nodes, 1, 1) == 4
    from wxray.platform.cluster.replicas import check_fits

    with pytest.raises(ConfigError, match="num_gpus=1"):
        check_fits(1, 1, 1)  # the test cluster has no GPU: an error, not a wait
    with pytest.raises(ConfigError, match="actors=99"):
        check_fits(99, 1, 0)
    assert issubclass(ConfigError, WxrayError)


def test_random_stream_denial_never_withholds_everything():
    from wxray.platform.train.stochastic import random_keep

    g = torch.Generator().manual_seed(0)
    keep = random_keep(4000, 3, 0.4, g, "cpu")
    assert keep.shape == (4000, 3) and set(keep.unique().tolist()) <= {0.0, 1.0}
    assert (keep.sum(1) >= 1).all()
    assert 0.55 < float(keep.mean()) < 0.65  # 1 - 0.4, a little more where all three were drawn out
    assert (random_keep(50, 3, 0.999, g, "cpu").sum(1) == 1).all()
