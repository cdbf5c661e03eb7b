"""jobs/train_sparse.py end to end on a local Ray cluster: FSDP2, fault tolerance, resume, bad input."""

from __future__ import annotations

import json
import shutil

import mlflow
import pytest
import torch

from tests.platform.conftest import write_tiny_store
from wxray.platform.job import run_job
from wxray.platform.train_config import TrainSparseConfig
from wxray.platform.trainer import train_sparse

SMALL = ["data.generate_sample=false", "model.embed_dim=32", "model.depth=4", "model.split=[1,2,1]",
         "model.num_heads=4", "data.batch_size=4", "optim.lr=3e-3", "optim.warmup_steps=3",
         "train.rollout_steps=2"]


@pytest.fixture(scope="module")
def wave_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("store") / "waves.zarr"
    write_tiny_store(path, n_traj=4, steps=20, grid=(8, 16), levels=(500,))
    return path


def _run(capsys, store, tmp_path, *extra):
    argv = [f"data.store={store}", f"tracking.uri=sqlite:///{tmp_path}/mlflow.db", *SMALL, *extra]
    rc = run_job("train_sparse", TrainSparseConfig, train_sparse, argv)
    cap = capsys.readouterr()
    results = [line for line in cap.out.splitlines() if line.startswith("RESULT ")]
    return rc, (json.loads(results[-1][7:]) if results else None), cap.err


def _history(tmp_path, run_id, key):
    client = mlflow.tracking.MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    return [m.value for m in sorted(client.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp))]


@pytest.mark.slow
def test_fsdp2_two_workers_survive_a_killed_worker_and_learn(ray_session, wave_store, tmp_path, capsys):
    out = tmp_path / "run"
    rc, res, err = _run(capsys, wave_store, tmp_path, f"out_dir={out}", "scaling.num_workers=2",
                        "scaling.cpus_per_worker=0.5", "train.epochs=4", "train.fault_drill_epoch=2",
                        "train.max_failures=1")
    assert rc == 0, err
    assert (out / ".fault_drill_done").exists(), "the drill did not kill a worker"
    assert res["epochs"] == 4
    # Resumed from a checkpoint, not from scratch: epoch 0 reported once, then every epoch up to the last.
    # (Ray may restart from the checkpoint before the newest if the worker dies while that report is in flight.)
    epochs = _history(tmp_path, res["mlflow_run_id"], "epoch")
    assert epochs.count(0) == 1 and sorted(set(epochs)) == [0, 1, 2, 3] and epochs[-1] == 3, epochs
    assert epochs.count(2) == 1, epochs  # the epoch killed mid-way reported only after the restart
    sharded = _history(tmp_path, res["mlflow_run_id"], "train/fsdp_sharded")
    assert len(sharded) == len(epochs) and set(sharded) == {1.0}  # every epoch ran with FSDP2 DTensors
    losses = _history(tmp_path, res["mlflow_run_id"], "train/epoch_loss")
    assert losses[-1] < 0.7 * losses[0], losses
    assert set(res["val_rmse"]) == {"geopotential_500", "temperature_500"}
    assert (out / "validation_map.png").stat().st_size > 1000
    assert (out / "summary.json").exists() and (out / "forecast.zarr").exists()
    assert len(res["rollout_rmse"]["geopotential_500"]) == 2


@pytest.mark.slow
def test_same_run_name_resumes_from_last_checkpoint(ray_session, wave_store, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # run_name -> runs/train_sparse/<name> under the working directory
    rc, first, err = _run(capsys, wave_store, tmp_path, "run_name=resumable", "train.epochs=1")
    assert rc == 0, err
    rc, second, err = _run(capsys, wave_store, tmp_path, "run_name=resumable", "train.epochs=2")
    assert rc == 0, err
    assert second["mlflow_run_id"] == first["mlflow_run_id"]  # one MLflow run for the whole training
    assert second["epochs"] == 2
    assert _history(tmp_path, second["mlflow_run_id"], "epoch") == [0, 1]


def _checkpoint_dir(tmp_path, meta: dict | None, state) -> str:
    d = tmp_path / "ckpt"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir()
    if meta is not None:
        (d / "meta.json").write_text(json.dumps(meta))
    if isinstance(state, bytes):
        (d / "state.pt").write_bytes(state)
    else:
        torch.save(state, d / "state.pt")
    return str(d)


@pytest.mark.parametrize("extra, needle", [
    (["model.keep_ratio=0"], "model.keep_ratio must be in (0, 1]"),
    (["model.keep_ratio=1.5"], "model.keep_ratio must be in (0, 1]"),
    (["model.split=[1,1,1]"], "must be >= 0 and sum to model.depth=4"),
    (["model.patch_size=3"], "model.patch_size=3 does not divide the grid 8x16"),
    (["scaling.num_workers=8"], "needs 8.25 CPUs; the Ray cluster has 2"),
    (["data.input_variables=[2m_temperature]"], "variable '2m_temperature' not found"),
    (["model.selection=best"], "'model.selection' expects one of"),
    (["train.epochs=many"], "'train.epochs' expects int"),
])
def test_bad_training_input_is_one_line(ray_session, wave_store, tmp_path, capsys, extra, needle):
    out = tmp_path / "bad"
    rc, res, err = _run(capsys, wave_store, tmp_path, f"out_dir={out}", *extra)
    assert rc == 2 and res is None
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: ") and needle in last, last
    assert not out.exists()


@pytest.mark.parametrize("kind, needle", [
    ("garbage", "is corrupt or not a weights-only torch file"),
    ("foreign", "missing or unreadable meta.json"),
    ("mismatch", "model.embed_dim=64 does not match"),
    ("pickled", "is corrupt or not a weights-only torch file"),
])
def test_corrupt_or_foreign_checkpoint_is_rejected(ray_session, wave_store, tmp_path, capsys, kind, needle):
    fmt = "wxray-train-checkpoint-v1"
    if kind == "garbage":
        d = _checkpoint_dir(tmp_path, {"format": fmt}, b"\x00not a torch file")
    elif kind == "foreign":
        d = _checkpoint_dir(tmp_path, None, {"model": {}})
    elif kind == "mismatch":
        d = _checkpoint_dir(tmp_path, {"format": fmt, "model": {"embed_dim": 64}}, {"model": {}})
    else:  # arbitrary pickled objects must not be unpickled (weights_only=True)
        d = _checkpoint_dir(tmp_path, {"format": fmt}, {"model": {}, "evil": shutil.rmtree})
    out = tmp_path / "bad"
    rc, _, err = _run(capsys, wave_store, tmp_path, f"out_dir={out}", f"train.init_from={d}")
    assert rc == 2
    assert needle in err.strip().splitlines()[-1]
