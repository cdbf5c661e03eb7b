"""jobs/forecast.py on what it reads: another store (the training normalisation, other channels refused), a
store in a bucket or a public one, a project moved whole, a model from the MLflow registry."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import mlflow
import numpy as np
import pytest
import xarray as xr
import yaml

from tests.forecast.forecast_helpers import (
    TRAJECTORY_1,
    anchors_of,
    configs,
    run_captured,
    save_checkpoint,
)
from tests.mlflow_db import fresh_uri
from tests.tiny_store import write_tiny_store
from wxray.config_yaml import load_yaml
from wxray.data import location
from wxray.data.schema import open_stats, open_store
from wxray.data.windows import WindowReader, fit_spec, make_spec
from wxray.forecast import checkpoints, mlflow_model
from wxray.forecast.job import ForecastConfig, forecast
from wxray.forecast.rollout import rollout
from wxray.job import run_job
from wxray.tracking import Tracker, TrackingConfig
from wxray.verify.evaluate import EvaluateConfig, evaluate


@pytest.fixture(scope="module")
def doubled(store, tmp_path_factory):
    """`store` with every field and statistic times 2: the same channels, other statistics."""
    path = tmp_path_factory.mktemp("fc") / "doubled.zarr"
    (xr.open_zarr(store, consolidated=False) * 2).drop_encoding().to_zarr(path, zarr_format=3, consolidated=False)
    for name in ("mean", "std", "diff_mean", "diff_std"):
        stat = xr.open_zarr(store, group=f"stats/{name}", consolidated=False) * 2
        stat.drop_encoding().to_zarr(path, group=f"stats/{name}", zarr_format=3, consolidated=False, mode="w")
    return path


@pytest.mark.slow
@pytest.mark.parametrize("checkpoint", ["normalisation in meta.json", "older: the training store's stats"])
def test_another_store_is_normalised_with_the_training_statistics(store, doubled, tmp_path, capsys, monkeypatch,
                                                                   checkpoint):
    older = checkpoint.startswith("older")
    ckpt, model, spec = save_checkpoint(tmp_path / "ckpt", store, normalisation=not older)
    if older:  # and a relative data.store, as older config.yaml files hold it: relative to the wxray home
        meta = json.loads((ckpt / "meta.json").read_text())
        meta["data"]["store"] = store.name
        (ckpt / "meta.json").write_text(json.dumps(meta))
        monkeypatch.setenv("WXRAY_HOME", str(store.parent))
    rc, res, err = run_captured(capsys, "forecast", ForecastConfig, forecast,
                                [f"checkpoint={ckpt}", f"store={doubled}", f"out_dir={tmp_path / 'fc'}",
                                 "tracking.enabled=false", "steps=2", f"inits={TRAJECTORY_1}"])
    assert rc == 0, err
    fc = xr.open_zarr(res["forecast"])
    data, model_cfg = configs(store, "crop")
    other = open_store(doubled)
    trained = fit_spec(make_spec(str(doubled), other, open_stats(store), data), model_cfg.patch_size, "crop")
    own = fit_spec(make_spec(str(doubled), other, open_stats(doubled), data), model_cfg.patch_size, "crop")
    assert not np.array_equal(trained.in_std, own.in_std)
    anchors = anchors_of(doubled, fc)
    got = fc.geopotential.sel(level=500).values
    np.testing.assert_array_equal(rollout(model, trained, anchors, steps=2, batch_size=1)[:, :, 0], got)
    assert not np.allclose(rollout(model, own, anchors, steps=2, batch_size=1)[:, :, 0], got)


def test_normalisation_round_trips_through_meta_json(store, tmp_path):
    ckpt, _, spec = save_checkpoint(tmp_path / "ckpt", store)
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
    ckpt, _, _ = save_checkpoint(tmp_path / "ckpt", gone, normalisation=False)
    shutil.rmtree(gone)
    out = tmp_path / "out"
    rc, res, err = run_captured(capsys, "forecast", ForecastConfig, forecast,
                                [f"checkpoint={ckpt}", f"store={store}", f"out_dir={out}", "tracking.enabled=false",
                                 f"inits={TRAJECTORY_1}"])
    assert rc == 2 and res is None
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: ") and f"data.store={gone} is gone" in last, err
    assert not out.exists()


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
    ckpt, _, _ = save_checkpoint(tmp_path / "ckpt", store, normalisation=not older)
    path = tmp_path / "other.zarr"
    kw = {"with_const": other != "no constant", "levels": (850,) if other == "other level" else (500,)}
    ds = write_tiny_store(path, n_traj=2, steps=16, grid=(9, 16), **kw)
    if other == "extra variable":
        ds[["temperature"]].rename(temperature="humidity").drop_vars("trajectory").to_zarr(
            path, mode="a", zarr_format=3, consolidated=False)
    out = tmp_path / "out"
    rc, res, err = run_captured(capsys, "forecast", ForecastConfig, forecast,
                                [f"checkpoint={ckpt}", f"store={path}", f"out_dir={out}", "tracking.enabled=false",
                                 f"inits={TRAJECTORY_1}"])
    assert rc == 2 and res is None, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], err
    if other != "other level":
        assert lines[0].startswith(f"error: store {path} does not have the channels checkpoint {ckpt} was trained on")
    assert not out.exists()


@pytest.mark.slow
def test_a_store_in_a_bucket_forecasts_as_the_same_store_on_disk(store, s3_server, tmp_path, capsys):
    fs, _ = location.filesystem("s3://forecast")
    fs.mkdir("forecast")
    fs.put(str(store), "forecast/odd.zarr", recursive=True)
    ckpt, _, _ = save_checkpoint(tmp_path / "ckpt", store, "crop")
    got = {}
    for where, src in (("local", str(store)), ("s3", "s3://forecast/odd.zarr")):
        rc, res, err = run_captured(capsys, "forecast", ForecastConfig, forecast,
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
        rc, cards[where], err = run_captured(capsys, "evaluate", EvaluateConfig, evaluate,
                                             [f"forecast={fc}", f"truth={truth}", f"baseline={base}", "regrid=true",
                                              "n_bootstrap=100", "plots=false", f"out_dir={tmp_path / ('ev_' + where)}",
                                              "tracking.enabled=false"])
        assert rc == 0, err
    scores = [k for k in cards["local"] if k.startswith(("rmse.", "acc.", "baseline.", "rel_diff.", "n_significant"))]
    assert any(k.startswith("baseline.") for k in scores), scores
    assert scores and all(cards["s3"][k] == cards["local"][k] for k in scores), scores
    rc, _, err = run_captured(capsys, "evaluate", EvaluateConfig, evaluate,
                              ["forecast=s3://forecast/none.zarr", f"truth={store}", "tracking.enabled=false",
                               f"out_dir={tmp_path / 'ev_bad'}"])
    assert rc == 2 and "forecast s3://forecast/none.zarr does not exist" in err and not (tmp_path / "ev_bad").exists()


@pytest.mark.slow
def test_anonymous_reads_a_public_bucket_without_credentials(store, s3_server, tmp_path, capsys, monkeypatch):
    """`anonymous=true`: a public bucket (WeatherBench 2, ARCO) is read with no credentials anywhere; a private
    one is then refused in one line naming the URL, with nothing written."""
    fs, _ = location.filesystem("s3://public-era5")
    fs.mkdir("public-era5", acl="public-read")
    fs.put(str(store), "public-era5/odd.zarr", recursive=True)
    fs.mkdir("private-era5")
    fs.put(str(store), "private-era5/odd.zarr", recursive=True)
    ckpt, _, _ = save_checkpoint(tmp_path / "ckpt", store, "crop")
    monkeypatch.setenv(location.ANONYMOUS_ENV, "")  # restored after the test: the job sets it
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(var)
    got = {}
    for where, src in (("local", str(store)), ("public", "s3://public-era5/odd.zarr")):
        rc, res, err = run_captured(capsys, "forecast", ForecastConfig, forecast,
                                    [f"checkpoint={ckpt}", f"store={src}", f"out_dir={tmp_path / where}",
                                     "anonymous=true", "tracking.enabled=false", "steps=2", f"inits={TRAJECTORY_1}"])
        assert rc == 0, err
        got[where] = xr.open_zarr(res["forecast"]).geopotential.load()
    xr.testing.assert_identical(got["public"], got["local"])
    assert location.storage_options("s3://x")["anon"] is True
    rc, _, err = run_captured(capsys, "forecast", ForecastConfig, forecast,
                              [f"checkpoint={ckpt}", "store=s3://private-era5/odd.zarr",
                               f"out_dir={tmp_path / 'private'}", "anonymous=true", "tracking.enabled=false",
                               "steps=2"])
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "s3://private-era5/odd.zarr" in err, err
    assert not (tmp_path / "private").exists()


def test_a_project_moved_whole_forecasts_from_its_store_there_and_records_it(store, tmp_path, capsys, monkeypatch):
    """The checkpoint recorded the training store's absolute path where it was made; the project folder moved:
    the store is found at the same place under the wxray home, said in one line, and config.yaml and RESULT
    record the store used (not '')."""
    old = tmp_path / "old"
    shutil.copytree(store, old / "data" / "odd.zarr")
    ckpt, _, _ = save_checkpoint(old / "runs" / "ckpt", old / "data" / "odd.zarr")
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
    ckpt, _, spec = save_checkpoint(tmp_path / "ckpt", store, deterministic_eval=True)
    uri = fresh_uri(tmp_path)
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
        rc, res, err = run_captured(capsys, "forecast", ForecastConfig, forecast,
                                    [f"checkpoint={where}", f"out_dir={tmp_path / name}", f"tracking.uri={uri}",
                                     "steps=1", f"inits={TRAJECTORY_1}"])
        assert rc == 0, err
        runs[name] = res
    assert runs["registry"]["checkpoint"] == "models:/wxray-test/1"
    xr.testing.assert_identical(xr.open_zarr(runs["folder"]["forecast"]).drop_attrs(),
                                xr.open_zarr(runs["registry"]["forecast"]).drop_attrs())
    rc, res, err = run_captured(capsys, "forecast", ForecastConfig, forecast,
                                ["checkpoint=models:/wxray-test/7", f"out_dir={tmp_path / 'none'}",
                                 f"tracking.uri={uri}"])
    assert rc == 2 and err.strip().startswith("error: checkpoint models:/wxray-test/7: not in the model registry")
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "none").exists()
