"""Shared fixtures: one local Ray cluster per test session, gpu marker handling."""

from __future__ import annotations

import os
import sqlite3  # noqa: F401  (before any cfgrib/eccodes import: see wxray/__init__.py)

import pytest

os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
# Every Ray Train run here is seconds long: its controller polls the workers every 0.5 s, not 2 s (a run's end
# is seen sooner), and starts no preemption-watcher actor (one process less per run; no test preempts a node).
# Subprocess tests (sweep, elastic, job submit) inherit both.
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")
os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
os.environ.pop("RAY_ADDRESS", None)
# The MLflow servers the tests start run without MLflow 3's GenAI job runner, as `make mlflow-ui` runs them
# (7 processes per server, not 15).
os.environ.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The S3 endpoint of this session (`s3_server`): fixed before any Ray process starts, so that Ray's workers
# inherit it as a user's would from the standard chain. Fake credentials, and nothing beyond loopback.
S3_ENDPOINT = f"http://127.0.0.1:{free_port()}"
for _var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "WXRAY_ANONYMOUS"):
    os.environ.pop(_var, None)
os.environ.update(AWS_ENDPOINT_URL=S3_ENDPOINT, AWS_ACCESS_KEY_ID="wxray-test", AWS_SECRET_ACCESS_KEY="wxray-test",
                  AWS_DEFAULT_REGION="us-east-1")


def pytest_collection_modifyitems(config, items):
    import torch

    # Under `make test` (pytest -n 2 --dist loadfile --no-loadscope-reorder) the files go to the two workers in
    # this order: those with multi-process Ray tests first, so that the long ones do not start last.
    slow_files = {item.path for item in items if "slow" in item.keywords}
    items.sort(key=lambda item: item.path not in slow_files)
    if torch.cuda.is_available():
        return
    no_gpu = pytest.mark.skipif(True, reason="needs a CUDA/ROCm device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(no_gpu)


@pytest.fixture(scope="session")
def ray_session(tmp_path_factory):
    """The one Ray cluster of the test session (2 CPUs, as on the CI machine); one per pytest worker."""
    import ray

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
                 configure_logging=False)
    import ray.data

    ray.data.DataContext.get_current().enable_progress_bars = False
    yield ray
    ray.shutdown()


@pytest.fixture
def tracking_uri(tmp_path):
    from tests.mlflow_db import fresh_uri

    return fresh_uri(tmp_path)


@pytest.fixture(autouse=True)
def _no_leaked_tracking_uri(monkeypatch):
    """`mlflow.set_tracking_uri` exports MLFLOW_TRACKING_URI; a test calling it must not steer later tests."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    yield


@pytest.fixture(scope="session")
def small_store(tmp_path_factory):
    """A small shallow-water sample store (16x32, 2 trajectories of 2 days: 16 steps); data and platform tests."""
    from tests.data.obs_helpers import SMALL
    from wxray.data.sample import make_sample_store

    path = tmp_path_factory.mktemp("obs_store") / "small.zarr"
    make_sample_store(path, progress=False, **SMALL)
    return path


@pytest.fixture(scope="session")
def small_obs(small_store, tmp_path_factory):
    """The sample observation streams derived from `small_store` (seed 0)."""
    from wxray.data.obs.sample import make_sample_obs

    out = tmp_path_factory.mktemp("obs_dir") / "obs"
    return make_sample_obs(small_store, out, seed=0)


@pytest.fixture
def tiny_store(tmp_path):
    """A tiny store of travelling waves (8 x 16, two levels, a land-sea mask) and its dataset."""
    from tests.tiny_store import write_tiny_store

    path = tmp_path / "tiny.zarr"
    return path, write_tiny_store(path)


@pytest.fixture(scope="session")
def wave_store(tmp_path_factory):
    """Learnable travelling waves on an 8x16 grid, one level: the training and sweep tests' store."""
    from tests.tiny_store import write_tiny_store

    path = tmp_path_factory.mktemp("store") / "waves.zarr"
    write_tiny_store(path, n_traj=4, steps=20, grid=(8, 16), levels=(500,))
    return path


@pytest.fixture(scope="session")
def s3_server():
    """An S3-compatible server (moto's server mode) on 127.0.0.1 at S3_ENDPOINT, started here, stopped at the
    end of the session; one per pytest worker."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    port = int(S3_ENDPOINT.rsplit(":", 1)[1])
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield S3_ENDPOINT
    server.stop()


@pytest.fixture(scope="session")
def s3_wave_store(s3_server, wave_store):
    """`wave_store` uploaded as it is to s3://era5/waves.zarr."""
    from wxray.data import location

    fs, _ = location.filesystem("s3://era5")
    fs.mkdir("era5")
    fs.put(str(wave_store), "era5/waves.zarr", recursive=True)
    return "s3://era5/waves.zarr"


@pytest.fixture
def small_disk(tmp_path):
    """A real 256 KiB file system (tmpfs) to fill: mounting needs root; elsewhere the test is skipped."""
    import subprocess

    mnt = tmp_path / "small_disk"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)],
                      capture_output=True).returncode != 0:
        pytest.skip("mounting a tmpfs needs root")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
