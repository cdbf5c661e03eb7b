"""jobs/forecast.py: a checkpoint -> forecast.zarr (routing members as an ensemble) -> jobs/evaluate.py."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
import xarray as xr

from tests.forecast.forecast_helpers import (
    TRAJECTORY_1,
    anchors_of,
    configs,
    run_captured,
    save_checkpoint,
)
from tests.mlflow_db import fresh_uri
from wxray.config import dump_yaml
from wxray.data.schema import open_store
from wxray.data.window_data import WindowData
from wxray.forecast.job import ForecastConfig, forecast
from wxray.forecast.rollout import rollout
from wxray.job import JobContext
from wxray.models import EDMForecaster
from wxray.platform.train.config import TrainSparseConfig
from wxray.platform.train.evaluation import evaluate_checkpoint
from wxray.provenance import store_fingerprint
from wxray.verify.evaluate import EvaluateConfig, evaluate


@pytest.mark.slow
def test_routing_members_forecast_recomputes_alone_and_evaluates(store, tmp_path, capsys):
    ckpt, model, spec = save_checkpoint(tmp_path / "ckpt", store, "crop")
    out = tmp_path / "fc"
    rc, res, err = run_captured(capsys, "forecast", ForecastConfig, forecast,
                                [f"checkpoint={ckpt}", f"out_dir={out}", f"tracking.uri={fresh_uri(tmp_path, 'm.db')}",
                                 "members=3", "steps=2", f"inits={TRAJECTORY_1}", "seed=5"])
    assert rc == 0, err
    assert res["members"] == 3 and res["grid"] == "8x16" and res["grid_fit"] == "crop" and res["inits"] == 13
    roll = res["rollout"]
    assert roll["lead_hours"] == [6, 12] and roll["scored"] == "ensemble mean" and roll["scored_inits"] == 13
    assert set(roll) >= {"rmse", "persistence_rmse", "units"}
    fc = xr.open_zarr(res["forecast"])  # consolidated metadata: plain open_zarr, no warning
    truth = open_store(store)
    assert fc.sizes["member"] == 3
    np.testing.assert_array_equal(fc.latitude.values, truth.latitude.values[1:])  # crop drops the south row
    # CF attributes, for tools that read them (wxray.data.cf)
    assert fc.attrs["Conventions"] == "CF-1.8"
    assert fc.latitude.attrs["units"] == "degrees_north" and fc.longitude.attrs["standard_name"] == "longitude"
    assert fc.level.attrs["units"] == "hPa" and fc.lead_time.attrs["standard_name"] == "forecast_period"
    assert fc.geopotential.attrs["long_name"] == "geopotential" and fc.attrs["source"] == "wxray rollout"
    z = fc.geopotential.sel(level=500).values  # (init, lead, member, lat, lon)
    assert not np.array_equal(z[:, :, 0], z[:, :, 1])
    # Member 2 of the 5th init recomputed alone, from its own (seed, init, member) generator: bit for bit.
    anchor = int(np.flatnonzero(truth.time.values == fc.init_time.values[4])[0])
    alone = rollout(model, spec, np.array([anchor]), steps=2, seed=5, members=[2])
    assert np.array_equal(alone[0, 0, :, 0], z[4, :, 2])

    # jobs/evaluate.py scores the ensemble against the untouched store (regrid: the south row was cropped).
    rc, card, err = run_captured(capsys, "evaluate", EvaluateConfig, evaluate,
                                 [f"forecast={res['forecast']}", f"truth={store}", "regrid=true", "n_bootstrap=200",
                                  "plots=false", f"out_dir={tmp_path / 'ev'}", f"tracking.uri=sqlite:///{tmp_path}/m.db"])
    assert rc == 0, err
    assert card["n_members"] == 3
    assert any(k.startswith("crps.geopotential_500") for k in card), card
    assert any(k.startswith("ssr.geopotential_500") for k in card), card


@pytest.mark.slow
def test_edm_members_are_samples_that_recompute_alone_and_evaluate(store, tmp_path, capsys):
    """A generative checkpoint: member m of an init is one EDM sample from its (seed, init, m) generator,
    fed back as history at the next lead; jobs/evaluate.py scores the ensemble (CRPS, spread-skill)."""
    ckpt, model, spec = save_checkpoint(tmp_path / "ckpt", store, "pad", name="edm")
    out = tmp_path / "fc"
    rc, res, err = run_captured(capsys, "forecast", ForecastConfig, forecast,
                                [f"checkpoint={ckpt}", f"out_dir={out}", "tracking.enabled=false", "members=3",
                                 "steps=2", f"inits={TRAJECTORY_1}", "seed=5", "sampler.steps=3",
                                 "sampler.sigma_max=10"])
    assert rc == 0, err
    assert res["members"] == 3 and res["grid"] == "9x16" and res["rollout"]["scored"] == "ensemble mean"
    fc = xr.open_zarr(res["forecast"])
    z = fc.geopotential.sel(level=500).values  # (init, lead, member, lat, lon)
    assert np.isfinite(z).all() and not np.array_equal(z[:, :, 0], z[:, :, 1])
    truth = open_store(store)
    anchor = int(np.flatnonzero(truth.time.values == fc.init_time.values[4])[0])
    sampler = EDMForecaster(model, steps=3, sigma_max=10.0)
    alone = rollout(sampler, spec, np.array([anchor]), steps=2, seed=5, members=[2])
    assert np.array_equal(alone[0, 0, :, 0], z[4, :, 2])
    other_seed = rollout(sampler, spec, np.array([anchor]), steps=2, seed=6, members=[2])
    assert not np.array_equal(other_seed, alone)

    rc, card, err = run_captured(capsys, "evaluate", EvaluateConfig, evaluate,
                                 [f"forecast={res['forecast']}", f"truth={store}", "plots=false",
                                  f"out_dir={tmp_path / 'ev'}", "tracking.enabled=false"])
    assert rc == 0, err
    assert card["n_members"] == 3 and any(k.startswith("ssr.geopotential_500") for k in card), card


def test_run_directory_with_config_yaml_and_padded_grid(store, tmp_path, capsys):
    run = tmp_path / "run"
    save_checkpoint(run / "ray" / "train" / "checkpoint_000000", store, "pad", data_in_meta=False)
    data, model_cfg = configs(store, "pad")
    (run / "config.yaml").write_text(dump_yaml(TrainSparseConfig(data=data, model=model_cfg)))
    rc, res, err = run_captured(capsys, "forecast", ForecastConfig, forecast,
                                [f"checkpoint={run}", f"out_dir={tmp_path / 'fc'}", "tracking.enabled=false",
                                 "steps=1"])
    assert rc == 0, err
    assert res["members"] == 1 and res["grid"] == "9x16" and res["grid_fit"] == "pad"
    assert res["inits"] >= 1 and res["rollout"]["scored_inits"] == res["inits"]  # default: the test split
    assert res["first_init"] >= "2000-01-07"  # the test split is the end of the record
    fc = xr.open_zarr(res["forecast"])
    assert "member" not in fc.dims and fc.sizes["latitude"] == 9  # pad keeps every row, writes no padding
    # provenance: the store forecast from (its metadata hash) and the checkpoint's own provenance
    prov = json.loads((tmp_path / "fc" / "summary.json").read_text())["provenance"]
    assert prov["store"] == store_fingerprint(store) and prov["store"]["time_range"][0] == "2000-01-01T00:00:00"
    assert prov["checkpoint"] == {"path": res["checkpoint"]} and prov["seeds"] == {"seed": 0}
    assert prov == json.loads((tmp_path / "fc" / "provenance.json").read_text())


def test_checkpoint_from_before_pos_embed_forecasts_with_the_fixed_table(store, tmp_path, capsys):
    """A meta.json without model.pos_embed was written by a model with the fixed sin-cos table."""
    ckpt, model, spec = save_checkpoint(tmp_path / "ckpt", store, pos_embed="fixed")
    meta = json.loads((ckpt / "meta.json").read_text())
    del meta["model"]["pos_embed"]
    (ckpt / "meta.json").write_text(json.dumps(meta))
    rc, res, err = run_captured(capsys, "forecast", ForecastConfig, forecast,
                                [f"checkpoint={ckpt}", f"out_dir={tmp_path / 'fc'}", "tracking.enabled=false",
                                 "steps=1", f"inits={TRAJECTORY_1}"])
    assert rc == 0, err
    fc = xr.open_zarr(res["forecast"])
    alone = rollout(model, spec, anchors_of(store, fc), steps=1, batch_size=1)
    np.testing.assert_array_equal(alone[:, :, 0], fc.geopotential.sel(level=500).values)


@pytest.mark.parametrize("what, needle", [
    ("missing", "does not exist"),
    ("empty", "no checkpoint found"),
    ("outside", "no init in store"),
    ("fixed_routing", "draws no random routing"),
    ("bad_range", "inits must be 'start/end' dates"),
    ("two_names", "config keys 'routing_members' and 'members' are one key"),
])
def test_bad_forecast_input_is_one_line(store, tmp_path, capsys, what, needle):
    ckpt, _, _ = save_checkpoint(tmp_path / "ckpt", store, deterministic_eval=what == "fixed_routing")
    (tmp_path / "empty").mkdir()
    argv = {"missing": [f"checkpoint={tmp_path / 'nope'}"],
            "empty": [f"checkpoint={tmp_path / 'empty'}"],
            "outside": [f"checkpoint={ckpt}", "inits=1999-01-01/1999-02-01"],
            "fixed_routing": [f"checkpoint={ckpt}", "members=2", f"inits={TRAJECTORY_1}"],
            "bad_range": [f"checkpoint={ckpt}", "inits=2000-01-01"],
            "two_names": [f"checkpoint={ckpt}", "members=2", "routing_members=3"]}[what]
    out = tmp_path / "out"
    rc, res, err = run_captured(capsys, "forecast", ForecastConfig, forecast,
                                [*argv, f"out_dir={out}", "tracking.enabled=false"])
    assert rc == 2 and res is None
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: ") and needle in last, last
    assert not out.exists()


def test_a_corrupt_store_chunk_is_one_line_and_leaves_nothing(store, tmp_path, capsys):
    copy = tmp_path / "copy.zarr"
    shutil.copytree(store, copy)
    for chunk in (p for p in (copy / "geopotential" / "c").rglob("*") if p.is_file()):
        raw = chunk.read_bytes()
        chunk.write_bytes(raw[: len(raw) // 2])  # every chunk truncated: whichever the forecast reads first
    ckpt, _, _ = save_checkpoint(tmp_path / "ckpt", store)
    out = tmp_path / "out"
    rc, res, err = run_captured(capsys, "forecast", ForecastConfig, forecast,
                                [f"checkpoint={ckpt}", f"store={copy}", f"inits={TRAJECTORY_1}", f"out_dir={out}",
                                 "tracking.enabled=false"])
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]  # (and the progress bar)
    assert rc == 2 and res is None and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"error: store {copy}: variable 'geopotential', chunk c/") and "truncated" in lines[0]
    assert not out.exists()


@pytest.mark.parametrize("device, cuda_devices, needle", [
    ("cuda", 0, "config key 'device' is 'cuda' but this machine has no CUDA device"),
    ("cuda:3", 2, "config key 'device' is 'cuda:3' but this machine has 2 CUDA device(s)"),
    ("tpu", 0, "config key 'device' expects auto, cpu, cuda or cuda:<i>, got 'tpu'"),
])
def test_device_this_machine_lacks_is_one_line_before_the_job_starts(store, tmp_path, capsys, monkeypatch,
                                                                     device, cuda_devices, needle):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda_devices > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: cuda_devices)
    ckpt, _, _ = save_checkpoint(tmp_path / "ckpt", store)
    out = tmp_path / "out"
    rc, res, err = run_captured(capsys, "forecast", ForecastConfig, forecast,
                                [f"checkpoint={ckpt}", f"device={device}", f"inits={TRAJECTORY_1}", f"out_dir={out}",
                                 "tracking.enabled=false"])
    assert rc == 2 and res is None
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: ") and needle in last, err
    assert not out.exists()


@pytest.mark.slow
def test_training_evaluation_and_forecast_job_make_one_forecast(store, tmp_path, capsys):
    """After training (evaluate_checkpoint) and the forecast job share one pipeline: the same checkpoint,
    inits, steps and seed give the same forecast.zarr and per-lead scores."""
    ckpt, _, spec = save_checkpoint(tmp_path / "ckpt", store, deterministic_eval=True)
    data, model_cfg = configs(store, "crop", deterministic_eval=True)
    data.batch_size = 1
    cfg = TrainSparseConfig(data=data, model=model_cfg)
    cfg.train.rollout_steps, cfg.train.routing_members, cfg.tracking.enabled = 2, 2, False
    times = open_store(store).time.values
    windows = WindowData(spec, {"train": np.zeros(0, int), "val": np.zeros(0, int),
                                "test": np.flatnonzero(times <= np.datetime64("2000-01-04T06"))})
    ctx = JobContext("train_sparse", cfg, tmp_path / "train")
    after_training = evaluate_checkpoint(cfg, windows, ckpt, ctx.out_dir, ctx)
    said = capsys.readouterr().out  # fixed routing: the ensemble is dropped with a warning, not the run
    assert "wxray: train.routing_members=2 ignored: model.selection=random (deterministic_eval=True)" in said

    rc, res, err = run_captured(capsys, "forecast", ForecastConfig, forecast,
                                [f"checkpoint={ckpt}", f"out_dir={tmp_path / 'fc'}", "tracking.enabled=false",
                                 "steps=2", f"inits={TRAJECTORY_1}"])
    assert rc == 0, err
    job = {k: v for k, v in res["rollout"].items() if k != "scored_inits"}
    assert {k: v for k, v in after_training["rollout"].items() if k not in ("split", "note")} == job
    xr.testing.assert_identical(xr.open_zarr(after_training["forecast"]).drop_attrs(),
                                xr.open_zarr(res["forecast"]).drop_attrs())
