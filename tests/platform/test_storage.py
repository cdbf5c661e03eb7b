"""Training with no shared disk: a store, checkpoints and the run's copy in a bucket of the loopback S3 server
(train.storage, platform/train/storage.py); resumed on a "machine" that has none of the run on its disk, at
another size (FSDP2), through a worker's death; forecast and evaluated from the bucket."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlflow
import pytest
import xarray as xr

from tests.mlflow_db import fresh_uri
from tests.platform.test_trainer import SMALL, _history
from wxray.config import load_config
from wxray.data import location
from wxray.errors import ConfigError
from wxray.forecast.job import ForecastConfig, forecast
from wxray.forecast.job_e2e import ForecastE2EConfig, forecast_e2e
from wxray.job import run_job
from wxray.platform.train import storage
from wxray.platform.train.config import TrainSparseConfig
from wxray.platform.train.sparse import train_sparse
from wxray.platform.train.stage_config import TrainE2EConfig
from wxray.platform.train.stochastic import FinetuneStochasticConfig
from wxray.verify.evaluate import EvaluateConfig, evaluate


def _run(capsys, job, cfg_cls, main, argv):
    rc = run_job(job, cfg_cls, main, argv)
    cap = capsys.readouterr()
    results = [line for line in cap.out.splitlines() if line.startswith("RESULT ")]
    return rc, (json.loads(results[-1][7:]) if results else None), cap.out + cap.err


def _one_error_line(capsys, job, cfg_cls, main, argv) -> str:
    """The one line a failing job prints (exit 2, no RESULT)."""
    rc, res, out = _run(capsys, job, cfg_cls, main, argv)
    lines = out.strip().splitlines()
    assert rc == 2 and res is None and len(lines) == 1, out
    return lines[0]


def test_a_run_folder_under_storage_is_its_path_under_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "runs" / "train_sparse" / "exp1"
    assert storage.run_location("s3://b/runs", out) == "s3://b/runs/train_sparse/exp1"
    assert storage.ray_location("", out) == str(out / "ray")
    elsewhere = tmp_path / "elsewhere" / "x"
    assert storage.run_location("s3://b/runs", elsewhere) == "s3://b/runs/" + str(elsewhere.resolve()).lstrip("/")
    assert storage.ray_storage("s3://b/runs/", out)[0] == "b/runs/train_sparse/exp1/ray"
    assert storage.checkpoint_url("s3://b/runs", "b/runs/t/ray/train/checkpoint_1") == \
        "s3://b/runs/t/ray/train/checkpoint_1"


@pytest.mark.slow
def test_training_from_a_bucket_checkpoints_into_it_resumes_elsewhere_at_another_size_and_forecasts_from_it(
        ray_session, s3_wave_store, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the wxray home: runs/train_sparse/<run name>
    fs, _ = location.filesystem("s3://wxray-runs")
    fs.mkdir("wxray-runs")
    db = fresh_uri(tmp_path)
    # the learned selection: its head's BCE is computed from logits kept inside the sharded forward
    common = [f"data.store={s3_wave_store}", "train.storage=s3://wxray-runs/runs", "run_name=resumable", *SMALL,
              "model.selection=learned", "model.keep_ratio=0.25", "train.log_every=1", "train.rollout_steps=0",
              f"tracking.uri={db}"]
    rc, first, out = _run(capsys, "train_sparse", TrainSparseConfig, train_sparse, [*common, "train.epochs=1"])
    assert rc == 0, out
    remote = "wxray-runs/runs/train_sparse/resumable"
    assert first["checkpoint"].startswith(f"s3://{remote}/ray/train/checkpoint_"), first["checkpoint"]
    assert fs.exists(f"{first['checkpoint'][5:]}/state.pt")
    assert json.loads(fs.cat(f"{remote}/summary.json"))["epochs"] == 1  # the run's copy in the bucket
    assert fs.cat(f"{remote}/.mlflow_run_id").decode() == first["mlflow_run_id"]
    assert not list((tmp_path / "runs").glob("**/checkpoint_*"))  # nothing of Ray Train's on this disk

    # Another machine: no run directory. The same run name resumes from the bucket, at another size (the
    # one-worker checkpoint sharded over two FSDP2 workers), continues the MLflow run, and survives a worker
    # killed in its second epoch (Ray Train restores the workers from the bucket).
    shutil.rmtree(tmp_path / "runs")
    rc, second, out = _run(capsys, "train_sparse", TrainSparseConfig, train_sparse,
                           [*common, "train.epochs=2", "scaling.num_workers=2", "scaling.cpus_per_worker=0.5",
                            "train.fault_drill_epoch=1"])
    assert rc == 0, out
    assert f"resuming from s3://{remote}/ray/train/checkpoint_" in out
    assert second["mlflow_run_id"] == first["mlflow_run_id"]  # one MLflow run for the whole training
    assert second["epochs"] == 2
    assert (tmp_path / "runs" / "train_sparse" / "resumable" / ".fault_drill_done").exists()  # the kill happened
    assert _history(tmp_path, second["mlflow_run_id"], "epoch") == [1, 2]
    assert _history(tmp_path, second["mlflow_run_id"], "train/world_size") == [1, 2]
    assert _history(tmp_path, second["mlflow_run_id"], "train/fsdp_sharded") == [0, 1]
    client = mlflow.tracking.MlflowClient(db)
    aux = client.get_metric_history(second["mlflow_run_id"], "train/selector_loss")
    sharded = [m.value for m in aux if m.step > first["steps"]]
    assert sharded and all(0 < v < 2 for v in sharded), aux
    # Provenance: config.yaml, checkpoint meta and MLflow agree on what the run is now.
    out_dir = Path(second["out_dir"])
    assert out_dir.is_absolute() and out_dir == tmp_path / "runs" / "train_sparse" / "resumable"
    assert "epochs: 2" in (out_dir / "config.yaml").read_text()
    assert f"out_dir: {out_dir}" in (out_dir / "config.yaml").read_text()
    meta = json.loads(fs.cat(f"{second['checkpoint'][5:]}/meta.json"))
    assert meta["epoch"] == 2
    run = client.get_run(second["mlflow_run_id"])
    assert run.data.params["train.epochs"] == "1" and run.data.tags["resumed_with.train.epochs"] == "2"
    assert run.data.tags["mlflow.runName"] == "resumable"
    # ... and on what produced it: the commit, versions, the store's fingerprint, the seeds, the Ray nodes
    prov = json.loads((out_dir / "summary.json").read_text())["provenance"]
    assert json.loads(fs.cat(f"{remote}/summary.json"))["provenance"] == prov
    assert meta["provenance"]["git"] == prov["git"] and meta["provenance"]["store"] == prov["store"]
    assert prov["store"]["path"] == s3_wave_store and len(prov["store"]["metadata_sha256"]) == 64
    assert prov["seeds"]["train.seed"] == 0 and prov["ray_nodes"][0]["cpus"] >= 1
    assert run.data.tags["wxray.git_commit"] == prov["git"]["commit"]
    assert run.data.tags["wxray.store_sha256"] == prov["store"]["metadata_sha256"]

    # Forecast from the run's folder in the bucket (its newest checkpoint), then evaluate against the store there.
    rc, fc, out = _run(capsys, "forecast", ForecastConfig, forecast,
                       [f"checkpoint=s3://{remote}", f"out_dir={tmp_path / 'fc'}", "steps=2", f"tracking.uri={db}"])
    assert rc == 0, out
    assert fc["checkpoint"] == second["checkpoint"] and fc["store"] == s3_wave_store
    assert xr.open_zarr(fc["forecast"]).geopotential.notnull().all()
    rc, card, out = _run(capsys, "evaluate", EvaluateConfig, evaluate,
                         [f"forecast={fc['forecast']}", f"truth={s3_wave_store}", "n_bootstrap=100", "plots=false",
                          f"out_dir={tmp_path / 'ev'}", "tracking.enabled=false"])
    assert rc == 0, out
    assert any(k.startswith("rmse.") for k in card), card


def test_a_checkpoint_url_that_is_not_there_is_one_line(s3_server, tmp_path, capsys):
    fs, _ = location.filesystem("s3://wxray-empty")
    fs.mkdir("wxray-empty")
    for url, needle in (("s3://wxray-empty/runs/x", "does not exist"),
                        ("s3://no-such-bucket/x", "does not exist")):
        line = _one_error_line(capsys, "forecast", ForecastConfig, forecast,
                               [f"checkpoint={url}", f"out_dir={tmp_path / 'fc'}", "tracking.enabled=false"])
        assert line.startswith(f"error: checkpoint {url}") and needle in line, line
    assert not (tmp_path / "fc").exists()


def test_a_storage_bucket_that_is_not_there_is_one_line_before_any_work(s3_server, wave_store, tmp_path, capsys):
    rc, res, out = _run(capsys, "train_sparse", TrainSparseConfig, train_sparse,
                        [f"data.store={wave_store}", "train.storage=s3://no-such-bucket/runs", *SMALL,
                         f"out_dir={tmp_path / 'run'}", "tracking.enabled=false"])
    assert rc == 2 and res is None, out
    assert "config key 'train.storage' is s3://no-such-bucket/runs: bucket s3://no-such-bucket does not exist" in out
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("cfg_cls", [TrainE2EConfig, FinetuneStochasticConfig])
def test_the_end_to_end_stages_refuse_a_storage_they_cannot_use_in_one_line(cfg_cls, tmp_path):
    with pytest.raises(ConfigError, match="config key 'train.storage' is for jobs/train_sparse.py"):
        load_config(cfg_cls, ["train.storage=s3://wxray-runs/runs", f"out_dir={tmp_path / 'x'}"])
    with pytest.raises(ConfigError, match=r"stages=s3://wxray-runs/e2e: the end-to-end stages are trained into a "
                                          r"folder every node sees, not a URL; copy the folder to a bucket"):
        load_config(cfg_cls, ["stages=s3://wxray-runs/e2e", f"out_dir={tmp_path / 'x'}"])
    assert not (tmp_path / "x").exists()


def test_a_stages_url_without_stages_is_one_line(s3_server, tmp_path, capsys):
    fs, _ = location.filesystem("s3://wxray-nostages")
    fs.mkdir("wxray-nostages")
    fs.pipe("wxray-nostages/e2e/notes.txt", b"not a stage")
    for url, needle in (("s3://wxray-nostages/e2e", "no stage with a checkpoint in it"),
                        ("s3://wxray-nostages/gone", "not found")):
        line = _one_error_line(capsys, "forecast_e2e", ForecastE2EConfig, forecast_e2e,
                               [f"stages={url}", f"out_dir={tmp_path / 'fc'}", "tracking.enabled=false"])
        assert line.startswith("error: ") and url in line and needle in line, line
    assert not (tmp_path / "fc").exists()
