"""`ray job submit` against a separate `ray start --head`, as the README documents it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.platform.conftest import write_tiny_store

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_train_job_runs_under_ray_job_submit(tmp_path):
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}", "RAY_AUTH_MODE": "token"}
    env.pop("RAY_ADDRESS", None)
    store = tmp_path / "store.zarr"
    write_tiny_store(store, n_traj=2, steps=12, grid=(8, 16), levels=(500,))
    gcs, dash, agent = _free_port(), _free_port(), _free_port()
    # --block: the head's processes die with this one, so the test never needs `ray stop` (which would
    # also stop the test session's own cluster). Its own agent port: the session cluster holds the default.
    head = subprocess.Popen([str(bin_dir / "ray"), "start", "--head", "--block", f"--port={gcs}",
                             f"--dashboard-port={dash}", f"--dashboard-agent-listen-port={agent}",
                             "--num-cpus=2", "--disable-usage-stats",
                             "--include-dashboard=true"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        address = f"http://127.0.0.1:{dash}"
        for _ in range(90):  # the dashboard's job server takes a while to come up
            probe = subprocess.run([str(bin_dir / "ray"), "job", "list", "--address", address],
                                   env=env, capture_output=True, text=True)
            if probe.returncode == 0:
                break
            time.sleep(1)
        home = tmp_path / "project"  # the user's folder: the README recipe passes it as WXRAY_HOME
        runtime_env = json.dumps({"env_vars": {"WXRAY_HOME": str(home)}})
        argv = [str(bin_dir / "ray"), "job", "submit", "--address", address, "--working-dir", str(ROOT),
                "--runtime-env-json", runtime_env, "--",
                "python", "jobs/train_sparse.py", f"data.store={store}",
                "model.embed_dim=32", "model.depth=4", "model.split=[1,2,1]", "train.epochs=1",
                "train.rollout_steps=1", "run_name=submitted"]
        for _ in range(30):  # the job server answers before its agent is ready to take a job
            job = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=420)
            if "No available agent" not in job.stdout + job.stderr:
                break
            time.sleep(2)
        assert job.returncode == 0, job.stdout[-2000:] + job.stderr[-2000:]
        results = [line[line.index("RESULT "):] for line in job.stdout.splitlines() if "RESULT {" in line]
        assert results, job.stdout[-2000:]
        result = json.loads(results[-1][len("RESULT "):])
        out = home / "runs" / "train_sparse" / "submitted"  # in the user's folder, not Ray's copy
        assert result["out_dir"] == str(out) and Path(result["checkpoint"]).is_relative_to(out)
        summary = json.loads((out / "summary.json").read_text())
        assert summary["epochs"] == 1 and summary["mlflow_run_id"] == result["mlflow_run_id"]
        assert result["mlflow_uri"] == f"sqlite:///{home / 'runs' / 'mlflow.db'}"
        import mlflow

        run = mlflow.tracking.MlflowClient(result["mlflow_uri"]).get_run(result["mlflow_run_id"])
        assert run.info.status == "FINISHED"  # visible to `make mlflow-ui` (WXRAY_HOME/runs/mlflow.db)
    finally:
        head.terminate()
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()
        # `ray start` records its address for later `ray.init()` calls; the cluster is gone now.
        current = Path("/tmp/ray/ray_current_cluster")
        if current.exists() and current.read_text().strip().endswith(f":{gcs}"):
            current.unlink()
