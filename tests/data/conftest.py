"""Fixtures of the data-layer tests: job runners (helpers are in data_helpers.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.data.data_helpers import JobRun
from wxray.job import run_job
from wxray.prepare import stores as jobs


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
