"""model.* config keys of issue 7: selection names, pos_embed, selector_loss_weight, the droppath baseline."""

from __future__ import annotations

from pathlib import Path

import pytest

from wxray.config import load_config
from wxray.errors import CheckpointError, ConfigError
from wxray.forecast import checkpoints
from wxray.models import SELECTIONS
from wxray.models.registry import ModelConfig, Selection
from wxray.platform.train.config import TrainSparseConfig

ROOT = Path(__file__).resolve().parents[2]


def test_droppath_without_drop_path_is_refused_with_one_line():
    with pytest.raises(ConfigError, match=r"^model.name=droppath needs model.drop_path > 0 \(e.g. 0.1\)$"):
        load_config(TrainSparseConfig, ["model.name=droppath", "model.keep_ratio=1"])
    cfg = load_config(TrainSparseConfig, ["model.name=droppath", "model.keep_ratio=1", "model.drop_path=0.1"])
    assert cfg.model.drop_path == 0.1


def test_new_model_keys_have_their_defaults_and_load():
    cfg = load_config(TrainSparseConfig, [])
    assert cfg.model.pos_embed == "learned" and cfg.model.selector_loss_weight == 0.01
    cfg = load_config(TrainSparseConfig, ["model.pos_embed=fixed", "model.selector_loss_weight=0"])
    assert cfg.model.pos_embed == "fixed" and cfg.model.selector_loss_weight == 0.0


def test_every_model_selection_is_a_config_selection():
    assert set(Selection.__args__) == set(SELECTIONS)
    for name in SELECTIONS:
        assert load_config(TrainSparseConfig, [f"model.selection={name}"]).model.selection == name


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["model.selector_loss_weight=-0.1"], "selector_loss_weight"),
        (["model.selector_loss_weight=nan"], "selector_loss_weight"),
        (["model.pos_embed=rope"], "pos_embed"),
        (["model.selection=activation_norm", "model.split=[0,6,2]"], "split[0] >= 1"),
        (["model.selection=topk_attention", "model.split=[0,6,2]"], "split[0] >= 1"),
    ],
)
def test_bad_model_keys_are_config_errors(argv, needle):
    with pytest.raises(ConfigError, match=needle.replace("[", r"\[")):
        load_config(TrainSparseConfig, argv)


def test_checkpoint_with_another_pos_embed_is_refused(tmp_path):
    learned = {"name": "reslim", "pos_embed": "learned"}
    checkpoints.save(tmp_path, {"model": {}}, {"model": learned})
    assert checkpoints.read_meta(tmp_path, expect_model=learned)["model"] == learned
    with pytest.raises(CheckpointError, match="model.pos_embed='learned' does not match this run's 'fixed'"):
        checkpoints.read_meta(tmp_path, expect_model={**learned, "pos_embed": "fixed"})


def test_demo_config_lists_every_selection():
    line = next(ln for ln in (ROOT / "configs" / "train_sparse.yaml").read_text().splitlines() if "selection:" in ln)
    assert [n.strip() for n in line.split("#", 1)[1].split("|")] == list(SELECTIONS)
    assert ModelConfig().selection == line.split(":")[1].split("#")[0].strip()


def test_checkpoints_from_before_pos_embed_count_as_fixed(tmp_path):
    import json

    import pytest
    import torch

    from wxray.errors import CheckpointError
    from wxray.forecast import checkpoints

    torch.save({"model": {}}, tmp_path / "state.pt")
    (tmp_path / "meta.json").write_text(json.dumps({"format": checkpoints.FORMAT, "model": {"embed_dim": 32}}))
    checkpoints.read_meta(tmp_path, expect_model={"embed_dim": 32, "pos_embed": "fixed"})
    with pytest.raises(CheckpointError, match="model.pos_embed='fixed' does not match this run's 'learned'"):
        checkpoints.read_meta(tmp_path, expect_model={"embed_dim": 32, "pos_embed": "learned"})
