"""Search spaces: every key and value checked against the training config before Ray starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from wxray.config import load_config
from wxray.errors import ConfigError
from wxray.tune.space import SEED_KEY, n_trials, parse_space, trial_config
from wxray.tune.sweep import SweepConfig

BASE = {"model": {"embed_dim": 32, "depth": 4, "split": [1, 2, 1]}, "train": {"epochs": 2}}


def test_axes_cover_every_kind_and_repeat_adds_the_seed_grid():
    axes = parse_space({"model.keep_ratio": {"grid": [0.25, 1.0]}, "model.split": {"grid": [[1, 2, 1], [2, 0, 2]]},
                        "model.selection": {"choice": ["random", "laplacian"]},
                        "optim.lr": {"loguniform": [1e-4, 1e-2]}, "model.dropout": {"uniform": [0, 0.2]}},
                       BASE, repeat=3)
    assert [a.key for a in axes][-1] == SEED_KEY and axes[-1].values == (0, 1, 2)
    assert n_trials(axes, num_samples=2) == 2 * 2 * 3 * 2
    cfg = trial_config(BASE, {"model.split": [2, 0, 2], "model.keep_ratio": 0.25, SEED_KEY: 2})
    assert cfg.model.split == (2, 0, 2) and cfg.model.embed_dim == 32 and cfg.train.seed == 2


@pytest.mark.parametrize("space, repeat, needle", [
    ({}, 1, "config key 'space' is empty"),
    ({"model.keep": {"grid": [0.5]}}, 1, "space.model.keep: 'model.keep' is not a key of the swept job's config"),
    ({"keep_ratio": {"grid": [0.5]}}, 1, "did you mean model.keep_ratio?"),
    ({"model.keep_ratio": {"grid": [0.5, 2.0]}}, 1, "space.model.keep_ratio: value 2.0 is not valid here"),
    ({"model.keep_ratio": {"range": [0.1, 1]}}, 1, "space.model.keep_ratio expects one of {grid: [...]}"),
    ({"optim.lr": {"loguniform": [0, 1e-3]}}, 1, "space.optim.lr.loguniform expects 0 < lo < hi"),
    ({"optim.lr": {"uniform": [1e-3]}}, 1, "expects [lo, hi] with lo < hi"),
    ({"model.split": {"grid": [[1, 1, 1]]}}, 1, "model.split [1, 1, 1] must sum to model.depth=4"),
    ({"model.keep_ratio": {"grid": []}}, 1, "space.model.keep_ratio.grid expects a non-empty list"),
    ({"train.seed": {"grid": [0, 1]}}, 2, "searching train.seed and repeat=2 at once"),
    ({"model.keep_ratio": {"grid": [0.5]}}, 0, "config key 'repeat' must be >= 1"),
])
def test_bad_spaces_are_one_line_errors(space, repeat, needle):
    with pytest.raises(ConfigError) as e:
        parse_space(space, BASE, repeat)
    assert needle in str(e.value) and "\n" not in str(e.value)


SWEEPS = sorted((Path(__file__).resolve().parents[2] / "configs" / "sweeps").glob("*.yaml"))


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.name)
def test_ready_sweeps_load_and_their_spaces_check(path, monkeypatch):
    monkeypatch.chdir(path.parents[2])  # `base:` is relative to the wxray home
    monkeypatch.delenv("WXRAY_HOME", raising=False)
    cfg = load_config(SweepConfig, ["--config", str(path)])
    axes = parse_space(cfg.space, cfg.base_dict(), cfg.repeat, cfg.job_config_class())
    assert axes and n_trials(axes, cfg.num_samples) >= 2


def test_the_paper_sweeps_cover_fig5_table4_and_table5():
    spaces = {p.stem: load_config(SweepConfig, ["--config", str(p)]).space for p in SWEEPS}
    assert spaces["keep_ratio"]["model.keep_ratio"]["grid"] == [0.1, 0.25, 0.5, 0.75, 1.0]
    assert spaces["split"]["model.split"]["grid"] == [[1, 10, 1], [2, 8, 2], [3, 6, 3], [4, 4, 4]]
    assert "random" in spaces["selection"]["model.selection"]["grid"]
    assert spaces["dropout"]["dropout"]["grid"] == [0.05, 0.1, 0.2]  # the paper's calibration of p


def test_sweep_overrides_from_yaml_and_command_line_merge_key_by_key(monkeypatch):
    root = SWEEPS[0].parents[2]
    monkeypatch.chdir(root)
    cfg = load_config(SweepConfig, ["--config", str(root / "configs/sweeps/keep_ratio.yaml"),
                                    "overrides.scaling.use_gpu=true", "overrides.train.epochs=3"])
    base = cfg.base_dict()
    assert base["scaling"]["use_gpu"] is True and base["train"]["epochs"] == 3
    assert base["train"]["rollout_steps"] == 0 and base["model"]["depth"] == 12  # the YAML's overrides stay
