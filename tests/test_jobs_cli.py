"""The job scripts as a user runs them: bad input is one line on stderr and a non-zero exit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.parametrize("argv, needle", [
    (["model.keep_ratio=2"], "error: config key 'model.keep_ratio' must be in (0, 1], got 2.0"),
    (["model.depht=4"], "error: unknown config key 'model.depht'"),
    (["scaling.num_workers=two"], "error: config key 'scaling.num_workers' expects int or [int, int], got 'two'"),
])
def test_train_job_rejects_bad_config_in_one_line(tmp_path, argv, needle):
    out = tmp_path / "run"
    p = subprocess.run([sys.executable, str(ROOT / "jobs/train_sparse.py"), f"out_dir={out}", *argv],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines()[-1].startswith(needle)
    assert "Traceback" not in p.stderr
    assert "RESULT" not in p.stdout
    assert not out.exists()


@pytest.mark.slow
def test_errors_after_ray_starts_are_still_one_line(tmp_path):
    """Ray's own start-up lines (token authentication, ...) stay off the console unless --verbose."""
    out = tmp_path / "run"
    p = subprocess.run([sys.executable, str(ROOT / "jobs/train_sparse.py"), f"out_dir={out}", "scaling.num_workers=64",
                        f"data.store={tmp_path / 'sample.zarr'}", "data.generate_sample=true", "data.sample_days=2",
                        "data.sample_grid=[16,32]", "data.sample_trajectories=2", "tracking.enabled=false"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [p.stderr.strip().splitlines()[-1]], p.stderr
    assert "scaling.num_workers=64" in p.stderr and "Traceback" not in p.stderr
    assert not out.exists()

