"""Search spaces: every key and value checked against the training config before Ray starts."""

from __future__ import annotations

import pytest

from wxray.errors import ConfigError
from wxray.tune.space import SEED_KEY, n_trials, parse_space, trial_config

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
    ({"model.keep": {"grid": [0.5]}}, 1, "space.model.keep: 'model.keep' is not a key of the training config"),
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
