"""Elastic training: `scaling.num_workers=[1, 2]` on a local cluster that loses a worker node mid-run.

The run starts with two FSDP2 workers (one per worker node), loses a node after its second checkpoint, and
continues from its newest checkpoint with one worker until the last epoch, learning all the while. It is also
the test of a worker lost mid-run. (A checkpoint sharded again over more workers: the resume test in
test_trainer.py.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.mlflow_db import fresh_uri

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, sys, threading, time
from pathlib import Path
t0 = time.monotonic()
import ray
from ray.cluster_utils import Cluster
from tests.tiny_store import write_tiny_store
from wxray.job import run_job
from wxray.platform.train.config import TrainSparseConfig
from wxray.platform.train.sparse import train_sparse

tmp = Path(sys.argv[1])
store = tmp / "waves.zarr"
write_tiny_store(store, n_traj=4, steps=20, grid=(8, 16), levels=(500,))
# The head (1 CPU: the driver and data reads) cannot hold a 2-CPU worker: one worker per worker node.
# A lost node is declared dead after ~1 s, not Ray's ~15 s (health checks every 3 s, 5 misses allowed).
cluster = Cluster(initialize_head=True, head_node_args={
    "num_cpus": 1, "include_dashboard": False,
    "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 2}})
nodes = [cluster.add_node(num_cpus=2) for _ in range(2)]
cluster.wait_for_nodes()
out, timings = tmp / "run", {"startup_s": time.monotonic() - t0}

def lose_a_node():
    # after two checkpoints: the first is surely registered with Ray Train by then
    train = out / "ray" / "train"
    while len(list(train.glob("checkpoint_*"))) < 2:
        time.sleep(0.2)
    timings["node_lost_s"] = time.monotonic() - t0
    cluster.remove_node(nodes[1], allow_graceful=False)

threading.Thread(target=lose_a_node, daemon=True).start()
rc = run_job("train_sparse", TrainSparseConfig, train_sparse, [
    f"data.store={store}", f"out_dir={out}", f"ray_address={cluster.address}", f"tracking.uri=sqlite:///{tmp}/m.db",
    "scaling.num_workers=[1,2]", "scaling.cpus_per_worker=2", "data.read_cpus=0.5", "train.max_failures=2",
    "train.epochs=3", "train.rollout_steps=0", "model.embed_dim=32", "model.depth=4", "model.split=[1,2,1]",
    "model.selection=topk_attention"])  # a score-based selection (attention received) under FSDP2 too
timings["total_s"] = time.monotonic() - t0
print("TIMINGS " + json.dumps({"rc": rc, **timings}), flush=True)
ray.shutdown()
cluster.shutdown()
"""


def _history(db: str, run_id: str, key: str) -> list[float]:
    import mlflow

    client = mlflow.tracking.MlflowClient(db)
    return [m.value for m in sorted(client.get_metric_history(run_id, key), key=lambda m: (m.timestamp, m.step))]


@pytest.mark.slow
def test_elastic_run_loses_a_node_continues_smaller_and_finishes(tmp_path):
    start = time.monotonic()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # its own cluster, not the session's
    # Train notices the loss (a broken gloo link) before Ray has marked the node dead, and may first try the
    # old size again: that attempt gives up after this long (Ray's default: 60 s)
    env["RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"] = "10"
    fresh_uri(tmp_path, "m.db")  # the job's MLflow store, made before the job opens it
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=420)
    timings = [json.loads(ln[8:]) for ln in proc.stdout.splitlines() if ln.startswith("TIMINGS ")]
    results = [json.loads(ln[7:]) for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and timings and timings[0]["rc"] == 0 and results, \
        proc.stdout[-2000:] + proc.stderr[-3000:]
    t, res = timings[0], results[-1]
    print(f"elastic test: {time.monotonic() - start:.1f} s wall; cluster up {t['startup_s']:.1f} s, node lost at "
          f"{t['node_lost_s']:.1f} s, done {t['total_s']:.1f} s")
    assert "1-2 workers (elastic)" in proc.stdout
    assert res["epochs"] == 3
    db = f"sqlite:///{tmp_path}/m.db"
    epochs = _history(db, res["mlflow_run_id"], "epoch")
    world = _history(db, res["mlflow_run_id"], "train/world_size")
    sharded = _history(db, res["mlflow_run_id"], "train/fsdp_sharded")
    # two FSDP2 workers first, one after the loss (the gathered checkpoint loaded whole), never back to two
    assert world[0] == 2 and world[-1] == 1 and world == sorted(world, reverse=True), world
    assert [s for s, w in zip(sharded, world) if w == 2] == [1.0] * world.count(2)
    # continued from a checkpoint, not from scratch: epoch 1 reported once; every epoch up to the last
    assert epochs.count(1) == 1 and sorted(set(epochs)) == [1, 2, 3] and epochs[-1] == 3, epochs
    # exactly-once sharding at either size: every validation window scored once per epoch
    assert set(_history(db, res["mlflow_run_id"], "val/windows")) == {res["windows"]["val"]}
    losses = _history(db, res["mlflow_run_id"], "train/epoch_loss")
    assert losses[-1] < 0.7 * losses[0], losses
