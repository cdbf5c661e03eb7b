"""jobs/sweep.py on a local 2-CPU Ray cluster: ASHA stops trials early, MLflow child runs under the sweep's
parent run, the best config loads back into the training job, a killed sweep restores (ASHA's rungs too) and
finishes the rest."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import pandas as pd
import pytest
import yaml

from tests.mlflow_db import fresh_uri
from wxray.config import dump_yaml
from wxray.job import prepare, run_job
from wxray.platform.train.config import TrainSparseConfig
from wxray.tune.sweep import SweepConfig, sweep

ROOT = Path(__file__).resolve().parents[2]


def _sweep_yaml(path: Path, store: Path, **extra) -> Path:
    cfg = {"overrides": {"data.store": str(store), "data.generate_sample": False, "model.embed_dim": 16,
                         "model.depth": 3, "model.split": [1, 1, 1], "model.num_heads": 2, "data.batch_size": 4,
                         "optim.warmup_steps": 3, "train.epochs": 2, "train.rollout_steps": 0},
           # lr 1e-7 hardly moves from the initial weights: a poor trial after a good one in grid order, which
           # ASHA (a rung at epoch 1) stops after the restore on the good one's rung, recorded before the kill;
           # a second axis of one value
           "space": {"model.keep_ratio": {"grid": [0.5]}, "optim.lr": {"grid": [3.0e-3, 1.0e-7]}},
           "metric": "val/loss", "grace_period": 1, "reduction_factor": 2, **extra}
    path.write_text(dump_yaml(cfg))
    return path


def _result(out: str) -> dict | None:
    lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    return json.loads(lines[-1][7:]) if lines else None


@pytest.mark.slow
def test_sweep_stops_early_tracks_children_and_restores_after_a_kill(wave_store, tmp_path):
    out, db = tmp_path / "sweep", fresh_uri(tmp_path, "m.db")
    argv = [sys.executable, str(ROOT / "jobs/sweep.py"), "--config", str(_sweep_yaml(tmp_path / "s.yaml", wave_store)),
            f"out_dir={out}", f"tracking.uri={db}"]
    env = {**os.environ, "RAY_ADDRESS": ""}
    # First run: killed (with its local Ray cluster) as soon as one trial has finished (however far Tune's
    # own snapshot of the sweep had got: a trial finished after it is reported again, not rerun).
    first = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             start_new_session=True)
    try:
        deadline = time.time() + 300
        while not list(out.glob("trials/*/summary.json")) and first.poll() is None and time.time() < deadline:
            time.sleep(0.5)
    finally:
        ended = first.poll() is not None
        if not ended:
            os.killpg(first.pid, signal.SIGKILL)
        log = first.communicate()[0].decode()[-3000:]
    done_before = list(out.glob("trials/*/summary.json"))
    assert len(done_before) == 1 and not ended, log
    stamp = done_before[0].stat().st_mtime_ns

    second = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "restoring the sweep" in second.stdout
    res = _result(second.stdout)
    assert res["trials"] == 2 and res["failed"] == 0
    assert res["stopped_early"] == 1 and res["finished"] == 1, res  # ASHA's rungs outlived the kill
    assert done_before[0].stat().st_mtime_ns == stamp  # the finished trial was not run again

    # MLflow: one parent run, one child per trial (none duplicated by the restore); stopped ones tagged.
    client = mlflow.tracking.MlflowClient(db)
    exp = client.get_experiment_by_name("wxray-sweep")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == res["mlflow_run_id"]]
    assert len(parents) == 1 and parents[0].info.run_id == res["mlflow_run_id"]
    assert len(children) == 2, [c.info.run_name for c in children]
    table = pd.read_csv(res["results"])
    assert set(table["trial_id"]) == {c.info.run_name.split(":")[0] for c in children}
    first_id = done_before[0].parent.name
    for child in children:
        trial_id = child.info.run_name.split(":")[0]
        epochs = [int(m.value) for m in client.get_metric_history(child.info.run_id, "epoch")]
        stopped = bool(table.loc[table["trial_id"] == trial_id, "stopped_early"].iloc[0])
        assert child.info.status == "FINISHED", child.info.run_name  # a stopped trial ends cleanly too
        assert (child.data.tags.get("wxray.stopped") == "asha") == stopped, child.info.run_name
        assert sorted(set(epochs)) == list(range(1, (max(epochs) if stopped else 2) + 1)), (trial_id, epochs)
        if trial_id == first_id:  # finished before the kill: not trained again after the restore
            assert epochs == [1, 2] and not stopped
    assert (out / "sweep.png").stat().st_size > 1000

    # The best config is a training config: it loads back into jobs/train_sparse.py with the best values.
    best = prepare("train_sparse", TrainSparseConfig, ["--config", res["best_config"]])
    assert best.model.keep_ratio == res["best"]["model.keep_ratio"] and best.optim.lr == res["best"]["optim.lr"]
    assert best.model.embed_dim == 16 and best.train.epochs == 2


@pytest.mark.parametrize("extra, needle", [
    ({"metric": "val/rmse/vorticity"}, "config key 'metric': no trial reports 'val/rmse/vorticity'"),
    ({"overrides": {"scaling.cpus_per_worker": 1.0, "scaling.num_workers": 3}}, "exceed the cluster"),
    ({"space": {"model.keep_ratios": {"grid": [0.5]}}}, "'model.keep_ratios' is not a key of the swept job's config"),
])
def test_bad_sweeps_fail_before_any_trial(ray_session, wave_store, tmp_path, capsys, extra, needle):
    path = _sweep_yaml(tmp_path / "s.yaml", wave_store)
    cfg = yaml.safe_load(path.read_text())
    for k, v in extra.items():
        cfg[k] = {**cfg[k], **v} if k == "overrides" else v
    path.write_text(dump_yaml(cfg))
    out = tmp_path / "out"
    rc = run_job("sweep", SweepConfig, sweep, ["--config", str(path), f"out_dir={out}", "tracking.enabled=false"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err[-1].startswith("error: ") and needle in err[-1], err
    assert not out.exists()
