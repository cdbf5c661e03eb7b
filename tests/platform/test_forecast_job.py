"""jobs/forecast.py: a checkpoint -> forecast.zarr (routing members as an ensemble) -> jobs/evaluate.py."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import xarray as xr
import yaml

from tests.platform.conftest import write_tiny_store
from wxray.config import dump_yaml, to_dict
from wxray.config_yaml import load_yaml
from wxray.data.schema import open_stats, open_store
from wxray.data.window_data import DataConfig, WindowData
from wxray.data.windows import WindowReader, fit_spec, make_spec
from wxray.job import JobContext, run_job
from wxray.models import EDMForecaster
from wxray.models.registry import ModelConfig, build_forecaster, model_identity
from wxray.platform.inference.forecast import ForecastConfig, forecast
from wxray.platform.train import checkpoints
from wxray.platform.train.config import TrainSparseConfig
from wxray.platform.train.evaluation import evaluate_checkpoint
from wxray.platform.train.rollout import rollout
from wxray.provenance import store_fingerprint
from wxray.verify.evaluate import EvaluateConfig, evaluate

TRAJECTORY_1 = "2000-01-01T06/2000-01-04T06"  # every init of the first trajectory with truth 12 h ahead


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("fc") / "odd.zarr"
    write_tiny_store(path, n_traj=2, steps=16, grid=(9, 16), levels=(500,))  # 9 rows: patch 2 needs the fit
    return path


@pytest.fixture(scope="module")
def doubled(store, tmp_path_factory):
    """`store` with every field and statistic times 2: the same channels, other statistics."""
    path = tmp_path_factory.mktemp("fc") / "doubled.zarr"
    (xr.open_zarr(store, consolidated=False) * 2).drop_encoding().to_zarr(path, zarr_format=3, consolidated=False)
    for name in ("mean", "std", "diff_mean", "diff_std"):
        stat = xr.open_zarr(store, group=f"stats/{name}", consolidated=False) * 2
        stat.drop_encoding().to_zarr(path, group=f"stats/{name}", zarr_format=3, consolidated=False, mode="w")
    return path


def _configs(store, grid_fit: str, **model_kw):
    data = DataConfig(store=str(store), history=2, lead_steps=1, levels=[500], grid_fit=grid_fit)
    model = ModelConfig(embed_dim=16, depth=3, num_heads=2, split=(1, 1, 1), keep_ratio=0.5, skip_channels=8,
                        **model_kw)
    return data, model


def _spec(store, data, model):
    return fit_spec(make_spec(str(store), open_store(store), open_stats(store), data), model.patch_size,
                    data.grid_fit)


def _save_checkpoint(directory, store, grid_fit="crop", data_in_meta=True, normalisation=True, **kw):
    """A freshly initialised model saved as training saves it (faster than training one); without
    `data_in_meta` / `normalisation` as checkpoints written before meta.json kept them."""
    data, model_cfg = _configs(store, grid_fit, **kw)
    spec = _spec(store, data, model_cfg)
    torch.manual_seed(0)
    model = build_forecaster(model_cfg, spec)
    meta = {"model": model_identity(model_cfg, spec), "epoch": 1, "step": 1}
    if data_in_meta:
        meta["data"] = {**to_dict(data), "store": spec.store}
    if normalisation:
        meta[checkpoints.NORMALISATION] = checkpoints.normalisation_meta(spec)
    return checkpoints.save(directory, {"model": model.state_dict()}, meta), model, spec


def _run(capsys, job, cfg_cls, main, argv):
    rc = run_job(job, cfg_cls, main, argv)
    cap = capsys.readouterr()
    results = [line for line in cap.out.splitlines() if line.startswith("RESULT ")]
    return rc, (json.loads(results[-1][7:]) if results else None), cap.err


def test_routing_members_forecast_recomputes_alone_and_evaluates(store, tmp_path, capsys):
    ckpt, model, spec = _save_checkpoint(tmp_path / "ckpt", store, "crop")
    out = tmp_path / "fc"
    rc, res, err = _run(capsys, "forecast", ForecastConfig, forecast,
                        [f"checkpoint={ckpt}", f"out_dir={out}", f"tracking.uri=sqlite:///{tmp_path}/m.db",
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
    rc, card, err = _run(capsys, "evaluate", EvaluateConfig, evaluate,
                         [f"forecast={res['forecast']}", f"truth={store}", "regrid=true", "n_bootstrap=200",
                          "plots=false", f"out_dir={tmp_path / 'ev'}", f"tracking.uri=sqlite:///{tmp_path}/m.db"])
    assert rc == 0, err
    assert card["n_members"] == 3
    assert any(k.startswith("crps.geopotential_500") for k in card), card
    assert any(k.startswith("ssr.geopotential_500") for k in card), card


def test_edm_members_are_samples_that_recompute_alone_and_evaluate(store, tmp_path, capsys):
    """A generative checkpoint: member m of an init is one EDM sample from its (seed, init, m) generator,
    fed back as history at the next lead; jobs/evaluate.py scores the ensemble (CRPS, spread-skill)."""
    ckpt, model, spec = _save_checkpoint(tmp_path / "ckpt", store, "pad", name="edm")
    out = tmp_path / "fc"
    rc, res, err = _run(capsys, "forecast", ForecastConfig, forecast,
                        [f"checkpoint={ckpt}", f"out_dir={out}", "tracking.enabled=false", "members=3", "steps=2",
                         f"inits={TRAJECTORY_1}", "seed=5", "sampler.steps=3", "sampler.sigma_max=10"])
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

    rc, card, err = _run(capsys, "evaluate", EvaluateConfig, evaluate,
                         [f"forecast={res['forecast']}", f"truth={store}", "plots=false",
                          f"out_dir={tmp_path / 'ev'}", "tracking.enabled=false"])
    assert rc == 0, err
    assert card["n_members"] == 3 and any(k.startswith("ssr.geopotential_500") for k in card), card


def test_run_directory_with_config_yaml_and_padded_grid(store, tmp_path, capsys):
    run = tmp_path / "run"
    _save_checkpoint(run / "ray" / "train" / "checkpoint_000000", store, "pad", data_in_meta=False)
    data, model_cfg = _configs(store, "pad")
    (run / "config.yaml").write_text(dump_yaml(TrainSparseConfig(data=data, model=model_cfg)))
    rc, res, err = _run(capsys, "forecast", ForecastConfig, forecast,
                        [f"checkpoint={run}", f"out_dir={tmp_path / 'fc'}", "tracking.enabled=false", "steps=1"])
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


def _anchors(store, fc) -> np.ndarray:
    times = open_store(store).time.values
    return np.array([int(np.flatnonzero(times == t)[0]) for t in fc.init_time.values])


def test_checkpoint_from_before_pos_embed_forecasts_with_the_fixed_table(store, tmp_path, capsys):
    """A meta.json without model.pos_embed was written by a model with the fixed sin-cos table."""
    ckpt, model, spec = _save_checkpoint(tmp_path / "ckpt", store, pos_embed="fixed")
    meta = json.loads((ckpt / "meta.json").read_text())
    del meta["model"]["pos_embed"]
    (ckpt / "meta.json").write_text(json.dumps(meta))
    rc, res, err = _run(capsys, "forecast", ForecastConfig, forecast,
                        [f"checkpoint={ckpt}", f"out_dir={tmp_path / 'fc'}", "tracking.enabled=false", "steps=1",
                         f"inits={TRAJECTORY_1}"])
    assert rc == 0, err
    fc = xr.open_zarr(res["forecast"])
    alone = rollout(model, spec, _anchors(store, fc), steps=1, batch_size=1)
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
    ckpt, _, _ = _save_checkpoint(tmp_path / "ckpt", store, deterministic_eval=what == "fixed_routing")
    (tmp_path / "empty").mkdir()
    argv = {"missing": [f"checkpoint={tmp_path / 'nope'}"],
            "empty": [f"checkpoint={tmp_path / 'empty'}"],
            "outside": [f"checkpoint={ckpt}", "inits=1999-01-01/1999-02-01"],
            "fixed_routing": [f"checkpoint={ckpt}", "members=2", f"inits={TRAJECTORY_1}"],
            "bad_range": [f"checkpoint={ckpt}", "inits=2000-01-01"],
            "two_names": [f"checkpoint={ckpt}", "members=2", "routing_members=3"]}[what]
    out = tmp_path / "out"
    rc, res, err = _run(capsys, "forecast", ForecastConfig, forecast,
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
    ckpt, _, _ = _save_checkpoint(tmp_path / "ckpt", store)
    out = tmp_path / "out"
    rc, res, err = _run(capsys, "forecast", ForecastConfig, forecast,
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
    ckpt, _, _ = _save_checkpoint(tmp_path / "ckpt", store)
    out = tmp_path / "out"
    rc, res, err = _run(capsys, "forecast", ForecastConfig, forecast,
                        [f"checkpoint={ckpt}", f"device={device}", f"inits={TRAJECTORY_1}", f"out_dir={out}",
                         "tracking.enabled=false"])
    assert rc == 2 and res is None
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: ") and needle in last, err
    assert not out.exists()


@pytest.mark.parametrize("checkpoint", ["normalisation in meta.json", "older: the training store's stats"])
def test_another_store_is_normalised_with_the_training_statistics(store, doubled, tmp_path, capsys, monkeypatch,
                                                                   checkpoint):
    older = checkpoint.startswith("older")
    ckpt, model, spec = _save_checkpoint(tmp_path / "ckpt", store, normalisation=not older)
    if older:  # and a relative data.store, as older config.yaml files hold it: relative to the wxray home
        meta = json.loads((ckpt / "meta.json").read_text())
        meta["data"]["store"] = store.name
        (ckpt / "meta.json").write_text(json.dumps(meta))
        monkeypatch.setenv("WXRAY_HOME", str(store.parent))
    rc, res, err = _run(capsys, "forecast", ForecastConfig, forecast,
                        [f"checkpoint={ckpt}", f"store={doubled}", f"out_dir={tmp_path / 'fc'}",
                         "tracking.enabled=false", "steps=2", f"inits={TRAJECTORY_1}"])
    assert rc == 0, err
    fc = xr.open_zarr(res["forecast"])
    data, model_cfg = _configs(store, "crop")
    other = open_store(doubled)
    trained = fit_spec(make_spec(str(doubled), other, open_stats(store), data), model_cfg.patch_size, "crop")
    own = fit_spec(make_spec(str(doubled), other, open_stats(doubled), data), model_cfg.patch_size, "crop")
    assert not np.array_equal(trained.in_std, own.in_std)
    anchors = _anchors(doubled, fc)
    got = fc.geopotential.sel(level=500).values
    np.testing.assert_array_equal(rollout(model, trained, anchors, steps=2, batch_size=1)[:, :, 0], got)
    assert not np.allclose(rollout(model, own, anchors, steps=2, batch_size=1)[:, :, 0], got)


def test_normalisation_round_trips_through_meta_json(store, tmp_path):
    ckpt, _, spec = _save_checkpoint(tmp_path / "ckpt", store)
    meta = checkpoints.read_meta(ckpt)
    vectors = ("in_mean", "in_std", "out_mean", "out_std", "const_mean", "const_std")
    blank = replace(spec, **{v: np.zeros_like(getattr(spec, v)) for v in vectors})
    back = checkpoints.apply_normalisation(blank, meta, ckpt)
    for v in vectors:  # bit for bit, float32
        assert getattr(back, v).dtype == np.float32 and np.array_equal(getattr(back, v), getattr(spec, v)), v
    assert checkpoints.apply_normalisation(blank, {}, ckpt) is None  # older checkpoints: the caller decides


def test_older_checkpoint_whose_training_store_is_gone_is_one_line(store, tmp_path, capsys):
    gone = tmp_path / "gone.zarr"
    shutil.copytree(store, gone)
    ckpt, _, _ = _save_checkpoint(tmp_path / "ckpt", gone, normalisation=False)
    shutil.rmtree(gone)
    out = tmp_path / "out"
    rc, res, err = _run(capsys, "forecast", ForecastConfig, forecast,
                        [f"checkpoint={ckpt}", f"store={store}", f"out_dir={out}", "tracking.enabled=false",
                         f"inits={TRAJECTORY_1}"])
    assert rc == 2 and res is None
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: ") and f"data.store={gone} is gone" in last, err
    assert not out.exists()


def test_training_evaluation_and_forecast_job_make_one_forecast(store, tmp_path, capsys):
    """After training (evaluate_checkpoint) and the forecast job share one pipeline: the same checkpoint,
    inits, steps and seed give the same forecast.zarr and per-lead scores."""
    ckpt, _, spec = _save_checkpoint(tmp_path / "ckpt", store, deterministic_eval=True)
    data, model_cfg = _configs(store, "crop", deterministic_eval=True)
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

    rc, res, err = _run(capsys, "forecast", ForecastConfig, forecast,
                        [f"checkpoint={ckpt}", f"out_dir={tmp_path / 'fc'}", "tracking.enabled=false", "steps=2",
                         f"inits={TRAJECTORY_1}"])
    assert rc == 0, err
    job = {k: v for k, v in res["rollout"].items() if k != "scored_inits"}
    assert {k: v for k, v in after_training["rollout"].items() if k not in ("split", "note")} == job
    xr.testing.assert_identical(xr.open_zarr(after_training["forecast"]).drop_attrs(),
                                xr.open_zarr(res["forecast"]).drop_attrs())


@pytest.mark.parametrize("other, needle", [
    ("no constant", "missing ['land_sea_mask']"),
    ("extra variable", "not trained on ['humidity_500']"),
    ("other level", "variable 'geopotential' has no level [500] hPa (has: [850])"),
])
@pytest.mark.parametrize("older", [False, True], ids=["normalisation in meta.json", "older checkpoint"])
def test_a_store_with_other_channels_is_refused_before_any_work(store, tmp_path, capsys, other, needle, older):
    """jobs/forecast.py refuses a store whose variables, levels or constants are not the checkpoint's, in one
    line before the run directory exists -- also for checkpoints written before meta.json kept the
    normalisation (the training store's stats would not even have the new channel)."""
    ckpt, _, _ = _save_checkpoint(tmp_path / "ckpt", store, normalisation=not older)
    path = tmp_path / "other.zarr"
    kw = {"with_const": other != "no constant", "levels": (850,) if other == "other level" else (500,)}
    ds = write_tiny_store(path, n_traj=2, steps=16, grid=(9, 16), **kw)
    if other == "extra variable":
        ds[["temperature"]].rename(temperature="humidity").drop_vars("trajectory").to_zarr(
            path, mode="a", zarr_format=3, consolidated=False)
    out = tmp_path / "out"
    rc, res, err = _run(capsys, "forecast", ForecastConfig, forecast,
                        [f"checkpoint={ckpt}", f"store={path}", f"out_dir={out}", "tracking.enabled=false",
                         f"inits={TRAJECTORY_1}"])
    assert rc == 2 and res is None, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], err
    if other != "other level":
        assert lines[0].startswith(f"error: store {path} does not have the channels checkpoint {ckpt} was trained on")
    assert not out.exists()


def test_a_store_in_a_bucket_forecasts_as_the_same_store_on_disk(store, s3_server, tmp_path, capsys):
    from wxray.data import location

    fs, _ = location.filesystem("s3://forecast")
    fs.mkdir("forecast")
    fs.put(str(store), "forecast/odd.zarr", recursive=True)
    ckpt, _, _ = _save_checkpoint(tmp_path / "ckpt", store, "crop")
    got = {}
    for where, src in (("local", str(store)), ("s3", "s3://forecast/odd.zarr")):
        rc, res, err = _run(capsys, "forecast", ForecastConfig, forecast,
                            [f"checkpoint={ckpt}", f"store={src}", f"out_dir={tmp_path / where}",
                             "tracking.enabled=false", "steps=2", f"inits={TRAJECTORY_1}"])
        assert rc == 0, err
        got[where] = xr.open_zarr(res["forecast"]).geopotential.load()
    xr.testing.assert_identical(got["s3"], got["local"])
    # jobs/evaluate.py: the truth and a baseline in the bucket score the forecast as they do on disk
    fs.put(res["forecast"], "forecast/fc.zarr", recursive=True)
    baseline = tmp_path / "baseline.zarr"
    with xr.open_zarr(res["forecast"]) as fc:
        shifted = fc + 10.0
        for v in shifted.variables.values():
            v.encoding = {}  # the forecast's own codecs are zarr v2's
        shifted.to_zarr(baseline, zarr_format=3, consolidated=False)
    fs.put(str(baseline), "forecast/baseline.zarr", recursive=True)
    cards = {}
    for where, truth, fc, base in (("local", str(store), res["forecast"], str(baseline)),
                                   ("s3", "s3://forecast/odd.zarr", "s3://forecast/fc.zarr",
                                    "s3://forecast/baseline.zarr")):
        rc, cards[where], err = _run(capsys, "evaluate", EvaluateConfig, evaluate,
                                     [f"forecast={fc}", f"truth={truth}", f"baseline={base}", "regrid=true",
                                      "n_bootstrap=100", "plots=false", f"out_dir={tmp_path / ('ev_' + where)}",
                                      "tracking.enabled=false"])
        assert rc == 0, err
    scores = [k for k in cards["local"] if k.startswith(("rmse.", "acc.", "baseline.", "rel_diff.", "n_significant"))]
    assert any(k.startswith("baseline.") for k in scores), scores
    assert scores and all(cards["s3"][k] == cards["local"][k] for k in scores), scores
    rc, _, err = _run(capsys, "evaluate", EvaluateConfig, evaluate,
                      ["forecast=s3://forecast/none.zarr", f"truth={store}", "tracking.enabled=false",
                       f"out_dir={tmp_path / 'ev_bad'}"])
    assert rc == 2 and "forecast s3://forecast/none.zarr does not exist" in err and not (tmp_path / "ev_bad").exists()


def test_anonymous_reads_a_public_bucket_without_credentials(store, s3_server, tmp_path, capsys, monkeypatch):
    """`anonymous=true`: a public bucket (WeatherBench 2, ARCO) is read with no credentials anywhere; a private
    one is then refused in one line naming the URL, with nothing written."""
    from wxray.data import location

    fs, _ = location.filesystem("s3://public-era5")
    fs.mkdir("public-era5", acl="public-read")
    fs.put(str(store), "public-era5/odd.zarr", recursive=True)
    fs.mkdir("private-era5")
    fs.put(str(store), "private-era5/odd.zarr", recursive=True)
    ckpt, _, _ = _save_checkpoint(tmp_path / "ckpt", store, "crop")
    monkeypatch.setenv(location.ANONYMOUS_ENV, "")  # restored after the test: the job sets it
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(var)
    got = {}
    for where, src in (("local", str(store)), ("public", "s3://public-era5/odd.zarr")):
        rc, res, err = _run(capsys, "forecast", ForecastConfig, forecast,
                            [f"checkpoint={ckpt}", f"store={src}", f"out_dir={tmp_path / where}", "anonymous=true",
                             "tracking.enabled=false", "steps=2", f"inits={TRAJECTORY_1}"])
        assert rc == 0, err
        got[where] = xr.open_zarr(res["forecast"]).geopotential.load()
    xr.testing.assert_identical(got["public"], got["local"])
    assert location.storage_options("s3://x")["anon"] is True
    rc, _, err = _run(capsys, "forecast", ForecastConfig, forecast,
                      [f"checkpoint={ckpt}", "store=s3://private-era5/odd.zarr", f"out_dir={tmp_path / 'private'}",
                       "anonymous=true", "tracking.enabled=false", "steps=2"])
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "s3://private-era5/odd.zarr" in err, err
    assert not (tmp_path / "private").exists()


def test_a_project_moved_whole_forecasts_from_its_store_there_and_records_it(store, tmp_path, capsys, monkeypatch):
    """The checkpoint recorded the training store's absolute path where it was made; the project folder moved:
    the store is found at the same place under the wxray home, said in one line, and config.yaml and RESULT
    record the store used (not '')."""
    import shutil

    old = tmp_path / "old"
    shutil.copytree(store, old / "data" / "odd.zarr")
    ckpt, _, _ = _save_checkpoint(old / "runs" / "ckpt", old / "data" / "odd.zarr")
    new = tmp_path / "new"
    shutil.move(old, new)
    monkeypatch.setenv("WXRAY_HOME", str(new))
    out = new / "runs" / "fc"
    rc = run_job("forecast", ForecastConfig, forecast,
                 [f"checkpoint={new / 'runs' / 'ckpt'}", f"out_dir={out}", "tracking.enabled=false", "steps=1",
                  f"inits={TRAJECTORY_1}"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    res = json.loads(cap.out.strip().splitlines()[-1][len("RESULT "):])
    used = str(new / "data" / "odd.zarr")
    assert res["store"] == used
    assert load_yaml(out / "config.yaml")["store"] == used
    assert (f"wxray: the checkpoint's training store {old / 'data' / 'odd.zarr'} is gone; using {used}, the same "
            f"path under the wxray home {new}") in cap.out.splitlines()


def test_a_registered_model_forecasts_as_its_checkpoint_does(store, tmp_path, capsys):
    """The final checkpoint logged as an MLflow model and registered (what train_sparse does at its end), then
    `checkpoint=models:/<name>/<version>` from the registry: the same forecast as from the folder."""
    import mlflow

    from wxray.platform.train import mlflow_model
    from wxray.tracking import Tracker, TrackingConfig

    ckpt, _, spec = _save_checkpoint(tmp_path / "ckpt", store, deterministic_eval=True)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(TrackingConfig(uri=uri, experiment="wxray-train"), "trained")
    example = WindowReader(spec)({"anchor": np.array([2])})
    block = mlflow_model.log_model(tracker, "wxray-test", "reslim", "model: {}\n", checkpoint=ckpt, example=example)
    tracker.end()
    assert block["uri"] == "models:/wxray-test/1" and block["version"] == 1
    client = mlflow.MlflowClient(uri)
    version = client.get_model_version("wxray-test", "1")
    assert version.run_id == tracker.run_id
    folder = Path(mlflow.artifacts.download_artifacts(block["uri"], dst_path=str(tmp_path / "dl"), tracking_uri=uri))
    assert {p.name for p in folder.iterdir()} >= {"MLmodel", "checkpoint", "config.yaml"}
    mlmodel = yaml.safe_load((folder / "MLmodel").read_text())
    assert mlmodel["flavors"]["wxray"]["checkpoint"] == "checkpoint"
    assert json.loads(mlmodel["signature"]["inputs"])[0]["tensor-spec"]["shape"] == [-1, *example["x"].shape[1:]]
    runs = {}
    for name, where in (("folder", str(ckpt)), ("registry", block["uri"])):
        rc, res, err = _run(capsys, "forecast", ForecastConfig, forecast,
                            [f"checkpoint={where}", f"out_dir={tmp_path / name}", f"tracking.uri={uri}",
                             "steps=1", f"inits={TRAJECTORY_1}"])
        assert rc == 0, err
        runs[name] = res
    assert runs["registry"]["checkpoint"] == "models:/wxray-test/1"
    xr.testing.assert_identical(xr.open_zarr(runs["folder"]["forecast"]).drop_attrs(),
                                xr.open_zarr(runs["registry"]["forecast"]).drop_attrs())
    rc, res, err = _run(capsys, "forecast", ForecastConfig, forecast,
                        ["checkpoint=models:/wxray-test/7", f"out_dir={tmp_path / 'none'}", f"tracking.uri={uri}"])
    assert rc == 2 and err.strip().startswith("error: checkpoint models:/wxray-test/7: not in the model registry")
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "none").exists()
