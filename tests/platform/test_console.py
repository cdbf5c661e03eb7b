"""What a user sees of a training run: the job's own lines, no Ray internals (unless --verbose)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.platform.conftest import write_tiny_store

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_training_console_shows_progress_and_result_only(tmp_path):
    store = tmp_path / "store.zarr"
    write_tiny_store(store, n_traj=2, steps=12, grid=(8, 16), levels=(500,))
    p = subprocess.run([sys.executable, str(ROOT / "jobs" / "train_sparse.py"), f"data.store={store}",
                        "model.embed_dim=32", "model.depth=4", "model.split=[1,2,1]", "train.epochs=2",
                        "train.rollout_steps=2", f"out_dir={tmp_path / 'run'}"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    out = p.stdout.strip().splitlines()
    assert out[-1].startswith("RESULT {")
    assert all(line.startswith(("wxray: ", "RESULT ")) for line in out), out
    assert sum(line.startswith("wxray: epoch ") for line in out) == 2
    # stderr holds the rollout progress bar (carriage-return updates), nothing else
    err = [ln for ln in p.stderr.replace("\r", "\n").splitlines() if ln.strip()]
    assert all(ln.startswith("rollout") for ln in err), err
    assert len(out) + len(p.stderr.splitlines()) < 40
