"""jobs/train_sparse.py on a local Ray cluster: bad input, checkpoints refused before training.

A resumed run (on another machine, at another size, FSDP2, from a bucket): test_storage.py. A worker lost
mid-run: test_elastic.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
import torch

from tests.mlflow_db import fresh_uri
from tests.tiny_store import write_tiny_store
from wxray.job import run_job
from wxray.platform.train.config import TrainSparseConfig
from wxray.platform.train.sparse import train_sparse

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["data.generate_sample=false", "model.embed_dim=32", "model.depth=4", "model.split=[1,2,1]",
         "model.num_heads=4", "data.batch_size=4", "optim.lr=3e-3", "optim.warmup_steps=3",
         "train.rollout_steps=2"]


def _run(capsys, store, tmp_path, *extra, console: list | None = None):
    """(exit code, RESULT, stderr) of a training job; its stdout lines are appended to `console` if given. Its MLflow
    store is `tmp_path`/mlflow.db (made by the job unless the caller made it with `fresh_uri`)."""
    argv = [f"data.store={store}", f"tracking.uri=sqlite:///{tmp_path}/mlflow.db", *SMALL, *extra]
    rc = run_job("train_sparse", TrainSparseConfig, train_sparse, argv)
    cap = capsys.readouterr()
    if console is not None:
        console.extend(cap.out.splitlines())
    results = [line for line in cap.out.splitlines() if line.startswith("RESULT ")]
    return rc, (json.loads(results[-1][7:]) if results else None), cap.err


def _history(tmp_path, run_id, key):
    client = mlflow.tracking.MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    return [m.value for m in sorted(client.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp))]


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
    (["model.keep_ratio=0"], "config key 'model.keep_ratio' must be in (0, 1], got 0"),
    (["model.keep_ratio=1.5"], "config key 'model.keep_ratio' must be in (0, 1], got 1.5"),
    (["model.split=[1,1,1]"], "model.split [1, 1, 1] must sum to model.depth=4"),
    (["model.patch_size=3", "data.grid_fit=error"], "model.patch_size=3 does not divide the grid 8x16"),
    (["scaling.num_workers=8"], "needs 8.25 CPUs; the Ray cluster has 2"),
    (["data.input_variables=[2m_temperature]"], "variable '2m_temperature' not found"),
    (["model.selection=best"], "'model.selection' expects one of"),
    (["train.log_every=0"], "config key 'train.log_every' must be >= 1, got 0"),
    (["optim.lr=nan"], "config key 'optim.lr' expects a finite number, got 'nan'"),
    (["model.num_heads=0"], "config key 'model.num_heads' must be >= 1, got 0"),
    (["model.embed_dim=-4"], "config key 'model.embed_dim' must be >= 1, got -4"),
    (["data.train_range=/2000-01-03"], "data.train_range must be 'start/end' dates"),
    (["data.train_range=2000-01-01/2000-01-03", "data.val_range=2000-01-03/2000-01-04"],
     "data.train_range and data.val_range overlap"),
    (["train.epochs=many"], "'train.epochs' expects int"),
    (["data.store="], "config key 'data.store' is empty; expected the path of a zarr store"),
    (["model.name=edm", "model.selection=laplacian"], "model.selection must be random, got laplacian"),
    (["model.name=edm", "sampler.sigma_min=100"], "sampler.sigma_min=100.0 must not exceed sampler.sigma_max"),
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


def test_worker_side_errors_reach_the_user_as_one_line():
    from ray.exceptions import RayTaskError
    from ray.train.v2._internal.exceptions import UserExceptionWithTraceback
    from ray.train.v2.api.exceptions import WorkerGroupError

    from wxray.errors import DataError
    from wxray.platform.train.trainer import training_error as _training_error

    inner = DataError("store s.zarr: NaN/inf in windows with anchors [3]; training needs complete fields")
    task = RayTaskError("read", "Traceback (most recent call last):\n  ...", inner)  # a Ray Data read task
    for wrapped in (inner, task):
        chain = WorkerGroupError("Training failed due to worker errors:\n[Rank 1]",
                                 {1: UserExceptionWithTraceback(wrapped, "Traceback ...")})
        out = _training_error(chain)
        assert isinstance(out, DataError) and str(out) == str(inner)
    plain = _training_error(ValueError("Traceback (most recent call last):\nboom"))
    assert str(plain) == "training failed: boom"


def test_resume_with_a_different_model_is_refused_before_training(ray_session, wave_store, tmp_path, capsys):
    out = tmp_path / "run"
    ckpt = out / "ray" / "train" / "checkpoint_2026-01-01_00-00-00.000000"
    ckpt.mkdir(parents=True)
    torch.save({"model": {}}, ckpt / "state.pt")
    (ckpt / "meta.json").write_text(json.dumps({"format": "wxray-train-checkpoint-v1",
                                                "model": {"embed_dim": 64, "depth": 4}}))
    (out / "config.yaml").write_text("model:\n  embed_dim: 64\n")
    (out / ".mlflow_run_id").write_text("abc\n")
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    rc, _, err = _run(capsys, wave_store, tmp_path, f"out_dir={out}")
    assert rc == 2
    assert "model.embed_dim=64 does not match this run's 32" in err.strip().splitlines()[-1]
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before  # the run dir is untouched


def test_missing_store_is_an_error_and_creates_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, _, err = _run(capsys, tmp_path / "data" / "era5.zarr", tmp_path, f"out_dir={tmp_path / 'run'}")
    assert rc == 2
    assert f"data.store {tmp_path / 'data' / 'era5.zarr'} does not exist" in err.strip().splitlines()[-1]
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no store, no run directory, no MLflow db


def test_nan_store_fails_before_ray_starts(tmp_path, capsys, monkeypatch):
    import xarray as xr

    from wxray.platform.cluster import session

    def no_ray(*a, **k):
        raise AssertionError("Ray was started before the data were checked")

    monkeypatch.setattr(session, "ensure_ray", no_ray)
    store = tmp_path / "nan.zarr"
    write_tiny_store(store, n_traj=2, steps=10, grid=(8, 16), levels=(500,))
    ds = xr.open_zarr(store, consolidated=False)
    z = ds.geopotential.load()
    z[3, 0, 2, 2] = float("nan")
    z.to_dataset().to_zarr(store, mode="r+", consolidated=False,
                           region={"time": slice(0, 20), "level": slice(0, 1), "latitude": slice(0, 8),
                                   "longitude": slice(0, 16)})
    rc, _, err = _run(capsys, store, tmp_path, f"out_dir={tmp_path / 'run'}", "data.split_fractions=[1.0,0.0,0.0]")
    assert rc == 2
    last = err.strip().splitlines()[-1]
    assert "variable 'geopotential' has NaN/inf at 2000-01-01T18:00:00, in 3 train window(s)" in last, last
    assert not (tmp_path / "run").exists()


def test_unknown_channel_in_var_weights_is_an_error(tmp_path, wave_store, capsys, monkeypatch):
    from wxray.platform.cluster import session

    monkeypatch.setattr(session, "ensure_ray", lambda *a, **k: None)
    rc, _, err = _run(capsys, wave_store, tmp_path, f"out_dir={tmp_path / 'run'}",
                      "train.var_weights={temperature_850: 2.0}")
    assert rc == 2
    assert ("train.var_weights names 'temperature_850', not a target channel (channels: geopotential_500, "
            "temperature_500)") in err.strip().splitlines()[-1]


@pytest.mark.slow
def test_unreachable_cluster_is_an_error_after_the_timeout(tmp_path, wave_store):
    # A fresh process: this test session's own cluster would otherwise be reused.
    p = subprocess.run([sys.executable, str(ROOT / "jobs" / "train_sparse.py"), f"data.store={wave_store}",
                        *SMALL, "ray_address=127.0.0.1:1", "ray_timeout_s=2", f"out_dir={tmp_path / 'run'}",
                        f"tracking.uri=sqlite:///{tmp_path}/mlflow.db"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [  # the one line, nothing of Ray's before it
        "error: ray_address=127.0.0.1:1: no Ray cluster answers there after 2 s (Connection refused); "
        "start one with `ray start --head` or leave ray_address empty for a local cluster"]
    assert not (tmp_path / "run").exists()


def test_nan_in_a_constant_field_fails_on_the_driver(tmp_path):
    import xarray as xr

    from wxray.data.window_data import DataConfig, prepare_windows
    from wxray.errors import DataError

    store = tmp_path / "const.zarr"
    write_tiny_store(store, n_traj=2, steps=10, grid=(8, 16), levels=(500,))
    lsm = xr.open_zarr(store, consolidated=False).land_sea_mask.load()
    lsm[1, 1] = float("nan")
    lsm.to_dataset().to_zarr(store, mode="r+", consolidated=False)
    with pytest.raises(DataError, match="constant field 'land_sea_mask' has 1 NaN/inf values"):
        prepare_windows(DataConfig(store=str(store)))


def test_ray_keywords_are_not_probed_as_addresses(monkeypatch):
    from wxray.platform.cluster import session

    calls = []
    monkeypatch.setattr(session, "_reachable", lambda *a: calls.append(a))
    import ray

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: calls.append(("init", kw.get("address"))))
    session.ensure_ray("auto")
    session.ensure_ray("[::1]:6379")
    assert calls == [("init", "auto"), ("[::1]:6379", 60.0), ("init", "[::1]:6379")]


@pytest.mark.slow
def test_ctrl_c_stops_at_the_next_step_and_the_same_command_resumes(ray_session, wave_store, tmp_path):
    """As a user presses Ctrl-C in a terminal (SIGINT to the driver): the workers stop at the next step, the
    job says one line, exits 130 with the MLflow run KILLED; the same command resumes from the newest
    checkpoint, and no more than train.keep_checkpoints are kept."""
    import os
    import signal

    import ray

    out = tmp_path / "run"
    cmd = [sys.executable, "jobs/train_sparse.py", f"data.store={wave_store}", f"out_dir={out}",
           f"ray_address={ray.get_runtime_context().gcs_address}", f"tracking.uri={fresh_uri(tmp_path)}",
           *SMALL, "train.keep_checkpoints=2"]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    p = subprocess.Popen([*cmd, "train.epochs=200"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    lines = []
    for line in p.stdout:
        lines.append(line.rstrip())
        if "epoch 3/200" in line:
            p.send_signal(signal.SIGINT)
            break
    rest, err = p.communicate(timeout=300)
    lines += rest.splitlines()
    assert p.returncode == 130, (lines[-20:], err[-3000:])
    assert err.strip().splitlines() == [f"error: interrupted: its checkpoints stay in {out}; the same command resumes"]
    stopped = [ln for ln in lines if "stopped in epoch" in ln]
    assert len(stopped) == 1, lines[-20:]
    done = max(int(ln.split("epoch ")[1].split("/")[0]) for ln in lines if "/200: step" in ln)
    assert f"stopped in epoch {done + 1} at step" in stopped[0] and f"after epoch {done}" in stopped[0]
    client = mlflow.tracking.MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    [run] = client.search_runs(client.get_experiment_by_name("wxray-train").experiment_id)
    assert run.info.status == "KILLED"
    metas = sorted(out.glob("ray/**/checkpoint_*/meta.json"))
    assert len(metas) <= 2 and max(json.loads(m.read_text())["epoch"] for m in metas) == done

    again = subprocess.run([*cmd, f"train.epochs={done + 1}"], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    epochs = [ln for ln in again.stdout.splitlines() if f"/{done + 1}: step" in ln]
    assert "resuming from" in again.stdout and len(epochs) == 1 and f"epoch {done + 1}/" in epochs[0], epochs
    assert len(sorted(out.glob("ray/**/checkpoint_*/meta.json"))) <= 2
