"""Checkpoint bookkeeping: state.pt and meta.json count epochs the same way, older checkpoints resume."""

from __future__ import annotations

from pathlib import Path

import pytest

from wxray.errors import CheckpointError
from wxray.forecast import checkpoints


def test_resume_epoch_counts_epochs_completed_in_both_formats():
    # Written now: next_epoch = epochs completed = meta.json's epoch; the resumed run trains that index.
    assert checkpoints.resume_epoch({"next_epoch": 3, "step": 30}, "ckpt") == 3
    # Written before next_epoch: "epoch" was the index of the last epoch trained.
    assert checkpoints.resume_epoch({"epoch": 2, "step": 30}, "ckpt") == 3
    with pytest.raises(CheckpointError, match=r"^checkpoint ckpt/state.pt: no 'next_epoch'"):
        checkpoints.resume_epoch({"model": {}}, "ckpt")


def test_meta_model_completes_keys_added_since():
    assert checkpoints.meta_model({"model": {"embed_dim": 8}}) == {"embed_dim": 8, "pos_embed": "fixed"}
    assert checkpoints.meta_model({"model": {"pos_embed": "learned"}}) == {"pos_embed": "learned"}
    assert checkpoints.meta_model({}) == {}


@pytest.mark.parametrize("written_with", ["provenance", "older meta.json"])
def test_checkpoints_carry_provenance_and_older_ones_still_load(tmp_path, written_with):
    prov = {"git": {"commit": "abc", "dirty": False}, "store": {"path": "/s.zarr", "metadata_sha256": "ff"}}
    meta = {"model": {"embed_dim": 8}, **({checkpoints.PROVENANCE: prov} if written_with == "provenance" else {})}
    d = checkpoints.save(tmp_path / "ckpt", {"model": {}}, meta)
    _, back = checkpoints.load(d, expect_model={"embed_dim": 8})
    assert checkpoints.meta_provenance(back) == (prov if written_with == "provenance" else {})


def test_a_pickled_object_in_state_pt_is_refused_not_run(tmp_path):
    import shutil

    import torch

    d = tmp_path / "ckpt"
    checkpoints.save(d, {"model": {}}, {})
    torch.save({"model": {}, "evil": shutil.rmtree}, d / checkpoints.STATE)
    with pytest.raises(CheckpointError, match="is corrupt or not a weights-only torch file"):
        checkpoints.load(d)


def test_every_torch_load_is_weights_only_and_nothing_unpickles():
    """Security: checkpoints are data, never code. Every torch.load of the package and the jobs passes
    weights_only=True; nothing calls pickle.load(s); Tuner.restore reads only the sweep's run directory."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    calls = []
    for f in [*(root / "wxray").rglob("*.py"), *(root / "jobs").glob("*.py")]:
        text = f.read_text()
        assert not re.search(r"\b(c?pickle|dill)\.loads?\(", text), f
        for m in re.finditer(r"torch\.load\(", text):
            depth, end = 0, m.end() - 1
            for end in range(m.end() - 1, len(text)):
                depth += {"(": 1, ")": -1}.get(text[end], 0)
                if depth == 0:
                    break
            calls.append((f.name, text[m.start():end + 1]))
    assert calls and all("weights_only=True" in call for _, call in calls), calls
    # Tune's experiment state (a pickle) is restored only from the sweep's own run directory
    restores = [(f.name, line.strip()) for f in (root / "wxray").rglob("*.py")
                for line in f.read_text().splitlines() if re.search(r"\.(can_)?restore\((?!\.\.\.)", line)]
    assert restores and all(name == "sweep.py" and "str(tune_dir)" in line for name, line in restores), restores
    sweep = (root / "wxray" / "tune" / "sweep.py").read_text()
    assert 'tune_dir = sweep_dir / "tune"' in sweep and "sweep_dir = Path(ctx.out_dir).resolve()" in sweep


def test_prune_keeps_the_checkpoints_with_the_latest_steps(tmp_path):
    run = tmp_path / "ray" / "train"
    for name, step in (("checkpoint_2026-01-01_00-00-03", 12), ("checkpoint_2026-01-01_00-00-01", 4),
                       ("checkpoint_2026-01-01_00-00-02", 8), ("checkpoint_2026-01-01_00-00-04", 16)):
        checkpoints.save(run / name, {}, {"epoch": step // 4, "step": step})
    (run / "checkpoint_tmp").mkdir()  # being written: no meta.json yet, left alone
    gone = checkpoints.prune(tmp_path / "ray", keep=2)
    assert sorted(Path(g).name for g in gone) == ["checkpoint_2026-01-01_00-00-01", "checkpoint_2026-01-01_00-00-02"]
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint_2026-01-01_00-00-03", "checkpoint_2026-01-01_00-00-04",
                                                     "checkpoint_tmp"]
