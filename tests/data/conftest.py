"""Fixtures of the data-layer tests: job runners (helpers are in data_helpers.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.data.data_helpers import JobRun
from wxray.data import jobs
from wxray.job import run_job


@pytest.fixture(scope="session")
def prepare_job():
    return SimpleNamespace(PrepareDataConfig=jobs.PrepareDataConfig, main=jobs.prepare_data_main)


@pytest.fixture(scope="session")
def sample_job():
    return SimpleNamespace(SampleDataConfig=jobs.SampleDataConfig, main=jobs.make_sample_main)


@pytest.fixture
def run_prepare(prepare_job, capsys, tmp_path):
    """Run the prepare_data job through run_job (tracking off, run dir in tmp_path)."""

    def run(*argv: str) -> JobRun:
        capsys.readouterr()
        rc = run_job("prepare_data", prepare_job.PrepareDataConfig, prepare_job.main,
                     [*argv, f"out_dir={tmp_path / 'run'}", "tracking.enabled=false"])
        cap = capsys.readouterr()
        return JobRun(rc, cap.out, cap.err)

    return run


@pytest.fixture(scope="session")
def small_store(tmp_path_factory):
    """A small shallow-water sample store (16x32, 2 trajectories of 2 days: 16 steps)."""
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
