"""Checkpoint bookkeeping: state.pt and meta.json count epochs the same way, older checkpoints resume."""

from __future__ import annotations

import pytest

from wxray.errors import CheckpointError
from wxray.platform import checkpoints


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
