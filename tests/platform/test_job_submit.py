"""`ray job submit` against a separate `ray start --head` and a real MLflow server, as the README documents it
("Run on a cluster"): the job logs over HTTP, and the run is checked through the MLflow client."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.tiny_store import write_tiny_store
from wxray.platform.cluster import head

ROOT = Path(__file__).resolve().parents[2]


def _wait_for(url: str, proc: subprocess.Popen, what: str, seconds: int = 90) -> None:
    import urllib.error
    import urllib.request

    for _ in range(seconds * 2):
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except urllib.error.HTTPError:  # it answers (the dashboard asks for Ray's token)
            return
        except OSError:
            assert proc.poll() is None, f"{what} exited with {proc.returncode}"
            time.sleep(0.5)
    raise AssertionError(f"{what} did not answer at {url}")


def _stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)  # the server's workers too
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def _head_up(tmp_path: Path, bin_dir: Path, env: dict) -> tuple[int, dict[str, int]]:
    """The head on free ports, as `make ray-up` starts it: its pid and ports. Picked again when one
    is taken before the head binds it (the other test worker's Ray can take a port freed a moment ago)."""
    for attempt in range(3):
        ports = {"port": free_port(), "dashboard-port": free_port(), "dashboard-agent-listen-port": free_port(),
                 "ray-client-server-port": free_port()}
        try:
            return head.up(ports, 2, tmp_path / "ray-head.pid", tmp_path / "ray-head.log", ray=str(bin_dir / "ray"),
                           env=env), ports
        except head.HeadError:
            if attempt == 2:
                raise


@pytest.mark.slow
def test_train_job_runs_under_ray_job_submit_and_logs_to_an_mlflow_server(tmp_path):
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}", "RAY_AUTH_MODE": "token"}
    env.pop("RAY_ADDRESS", None)
    env.pop("MLFLOW_TRACKING_URI", None)
    store = tmp_path / "store.zarr"
    write_tiny_store(store, n_traj=2, steps=12, grid=(8, 16), levels=(500,))
    mlflow_port = free_port()
    # the server as `make mlflow-server` starts it: loopback, a sqlite backend, artifacts served over HTTP
    server = subprocess.Popen([str(bin_dir / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(mlflow_port),
                               "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}", "--serve-artifacts",
                               "--artifacts-destination", str(tmp_path / "server-artifacts"), "--workers", "1"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    tracking = f"http://127.0.0.1:{mlflow_port}"
    # Started as `make ray-up` starts it (wxray.platform.cluster.head): --block in a session of its own, so the
    # head's processes are one process group, stopped together; the test never needs `ray stop` (which would
    # also stop the test session's own cluster). Free ports: the session cluster holds the defaults.
    pid, ports = _head_up(tmp_path, bin_dir, env)
    try:
        address = f"http://127.0.0.1:{ports['dashboard-port']}"
        home = tmp_path / "project"  # the user's folder: the README recipe passes it as WXRAY_HOME
        _wait_for(f"{tracking}/health", server, "mlflow server")
        runtime_env = json.dumps({"env_vars": {"WXRAY_HOME": str(home), "MLFLOW_TRACKING_URI": tracking}})
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
        # The console: Ray's job framing, then the job's own lines only (progress, the run's address, RESULT)
        log = job.stdout.split("Running entrypoint for job", 1)[1].split("\n", 1)[1]
        log = log[:log.index("SUCC cli.py")].rsplit("\n", 1)[0]
        lines = [ln.strip() for ln in log.replace("\r", "\n").splitlines() if ln.strip()]
        assert all(ln.startswith(("wxray: ", "RESULT {", "rollout")) for ln in lines), lines
        assert sum(ln.startswith("wxray: epoch ") for ln in lines) == 1 and len(lines) < 40, lines
        assert any(ln.startswith(f"wxray: MLflow run: {tracking}/#/experiments/") for ln in lines), lines
        results = [line[line.index("RESULT "):] for line in job.stdout.splitlines() if "RESULT {" in line]
        assert results, job.stdout[-2000:]
        result = json.loads(results[-1][len("RESULT "):])
        out = home / "runs" / "train_sparse" / "submitted"  # in the user's folder, not Ray's copy
        assert result["out_dir"] == str(out) and Path(result["checkpoint"]).is_relative_to(out)
        summary = json.loads((out / "summary.json").read_text())
        assert summary["epochs"] == 1 and summary["mlflow_run_id"] == result["mlflow_run_id"]
        assert result["mlflow_uri"] == tracking and "tracking_fallback" not in result
        import mlflow

        client = mlflow.tracking.MlflowClient(tracking)
        run = client.get_run(result["mlflow_run_id"])
        assert run.info.status == "FINISHED"
        assert run.data.params["model.embed_dim"] == "32" and run.data.params["train.epochs"] == "1"
        assert run.data.tags["wxray.git_commit"] == summary["provenance"]["git"]["commit"]
        assert len(client.get_metric_history(run.info.run_id, "val/loss")) == 1  # one epoch
        assert run.data.metrics["val/loss"] == pytest.approx(result["val_loss"])
        names = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert {"summary.json", "config.yaml", "provenance.json"} <= names, names
        got = json.loads(Path(client.download_artifacts(run.info.run_id, "summary.json",
                                                        str(tmp_path / "got"))).read_text())
        assert got["mlflow_run_id"] == result["mlflow_run_id"]
        assert not (home / "runs" / "mlflow.db").exists()  # over HTTP, never a local sqlite file
        # The final checkpoint is a version in the server's model registry, and forecasts from there.
        registered = result["mlflow_model"]
        assert registered["uri"] == "models:/wxray-reslim/1"
        assert client.get_model_version("wxray-reslim", "1").run_id == result["mlflow_run_id"]
        from wxray.forecast.job import ForecastConfig, forecast
        from wxray.job import run_job

        rc = run_job("forecast", ForecastConfig, forecast,
                     [f"checkpoint={registered['uri']}", f"tracking.uri={tracking}", "steps=1",
                      f"out_dir={tmp_path / 'fc'}"])
        assert rc == 0
        summary = json.loads((tmp_path / "fc" / "summary.json").read_text())
        assert summary["checkpoint"] == "models:/wxray-reslim/1" and summary["rollout"]["scored_inits"] > 0
    finally:
        _stop(server)
        # The job is over and its run checked: the head's processes go at once (a SIGTERM'd head drains for
        # about 30 s), all of them, being the process group of `ray start --block`.
        os.killpg(pid, signal.SIGKILL)
        while head.group_alive(pid):
            time.sleep(0.2)
        # `ray start` records its address for later `ray.init()` calls; the cluster is gone now.
        current = Path("/tmp/ray/ray_current_cluster")
        if current.exists() and current.read_text().strip().endswith(f":{ports['port']}"):
            current.unlink()
