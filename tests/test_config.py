from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import pytest

from wxray.config import from_dict, load_config, to_dict
from wxray.errors import ConfigError


@dataclass
class Inner:
    keep_ratio: float = 0.25
    split: tuple[int, int, int] = (2, 4, 2)
    selection: Literal["random", "laplacian"] = "random"

    def validate(self):
        if not 0 < self.keep_ratio <= 1:
            raise ConfigError(f"model.keep_ratio must be in (0, 1], got {self.keep_ratio}")


@dataclass
class Cfg:
    model: Inner = field(default_factory=Inner)
    variables: list[str] = field(default_factory=lambda: ["geopotential"])
    start: str = ""
    epochs: int = 1


def test_defaults_yaml_then_overrides_in_order(tmp_path):
    y = tmp_path / "c.yaml"
    y.write_text("model:\n  keep_ratio: 0.5\nepochs: 3\n")
    assert load_config(Cfg, ["model.keep_ratio=5e-1"]).model.keep_ratio == 0.5
    cfg = load_config(Cfg, ["--config", str(y), "model.keep_ratio=1", "variables=[a, b]", "start=2017-01-01"])
    assert cfg.model.keep_ratio == 1.0 and isinstance(cfg.model.keep_ratio, float)
    assert cfg.epochs == 3
    assert cfg.variables == ["a", "b"]
    assert cfg.start == "2017-01-01"  # a date-looking string stays a string
    assert cfg.model.split == (2, 4, 2)


@pytest.mark.parametrize("argv, needle", [
    (["model.nope=1"], "unknown config key 'model.nope'"),
    (["nope=1"], "unknown config key 'nope'"),
    (["epochs=abc"], "'epochs' expects int"),
    (["epochs=1.5"], "'epochs' expects int"),
    (["model.split=[1,2]"], "'model.split' expects 3 values"),
    (["model.selection=topk"], "'model.selection' expects one of"),
    (["model.keep_ratio=0"], "model.keep_ratio must be in (0, 1]"),
    (["model=3"], "'model' is a section"),
    (["epochs"], "not of the form key=value"),
    (["--config", "/nonexistent.yaml"], "does not exist"),
    (["--verbose"], "unknown option '--verbose'"),
])
def test_bad_config_is_one_line_error_naming_the_key(argv, needle):
    with pytest.raises(ConfigError) as e:
        load_config(Cfg, argv)
    assert needle in str(e.value)
    assert "\n" not in str(e.value)


def test_dict_round_trip_for_ray_boundary():
    cfg = load_config(Cfg, ["model.split=[1,6,1]"])
    d = to_dict(cfg)
    assert d["model"]["split"] == [1, 6, 1]
    assert from_dict(Cfg, d) == cfg


@dataclass
class Strs:
    run_name: str = ""
    maybe: str | None = None
    weights: dict[str, float] = field(default_factory=dict)
    mode: Literal["a", "007"] = "a"


@pytest.mark.parametrize("token, expected", [("010", "010"), ("2024_01", "2024_01"), ("12:30", "12:30"),
                                             ("0x1F", "0x1F"), ("true", "true")])
def test_string_keys_keep_the_text_as_typed(token, expected):
    assert load_config(Strs, [f"run_name={token}"]).run_name == expected
    assert load_config(Strs, [f"maybe={token}"]).maybe == expected
    assert load_config(Strs, ["maybe=null"]).maybe is None
    assert load_config(Strs, ["mode=007"]).mode == "007"


def test_dict_values_are_coerced_and_checked(tmp_path):
    assert load_config(Strs, ["weights={geopotential: 1e-3, temperature: 2}"]).weights == \
        {"geopotential": 1e-3, "temperature": 2.0}
    with pytest.raises(ConfigError, match="'weights.geopotential' expects float"):
        load_config(Strs, ["weights={geopotential: abc}"])
    y = tmp_path / "c.yaml"
    y.write_text("run_name: 2024-01-01\n")
    assert load_config(Strs, ["--config", str(y)]).run_name == "2024-01-01"


def test_a_section_given_in_part_keeps_its_owners_defaults():
    from wxray.config import load_config
    from wxray.platform.train.stage_config import TrainE2EConfig

    cfg = load_config(TrainE2EConfig, ["data.batch_size=4", "processor.embed_dim=64"])
    assert (cfg.data.history, cfg.data.batch_size) == (1, 4)  # history 1 is the e2e factory's, not DataConfig's
    assert cfg.processor.embed_dim == 64 and tuple(cfg.processor.split) == (2, 2, 2)


def test_renamed_keys_keep_working_for_a_release_with_one_line(capsys):
    """One name per key in every job (JobConfig.renamed): the stages folder is `stages`, M and N are
    members.M/N, forecast's samples `members`; the old names still work, each with one deprecation line, and
    both names at once is an error. The OSE's deny is kept likewise."""
    from wxray.errors import ConfigError
    from wxray.forecast.job import ForecastConfig
    from wxray.forecast.job_e2e import ForecastE2EConfig
    from wxray.job import prepare
    from wxray.platform.ensemble.batch import EnsembleConfig
    from wxray.platform.ensemble.ose import OSEConfig
    from wxray.platform.train.stage_config import TrainE2EConfig
    from wxray.platform.train.stochastic import FinetuneStochasticConfig

    cfg = prepare("forecast_e2e", ForecastE2EConfig, ["members_m=3", "members_n=2"])
    assert (cfg.members.M, cfg.members.N) == (3, 2) and not hasattr(cfg, "members_m")
    out = capsys.readouterr().out.splitlines()
    assert out == ["wxray: config key 'members_m' is deprecated and will be removed: use 'members.M'",
                   "wxray: config key 'members_n' is deprecated and will be removed: use 'members.N'"]
    assert prepare("forecast_e2e", ForecastE2EConfig, ["members.M=4"]).members.M == 4
    assert capsys.readouterr().out == ""
    for job, cls, argv, key, value in [
            ("ensemble", EnsembleConfig, ["checkpoint=runs/train_e2e/x"], "stages", "runs/train_e2e/x"),
            ("ose", OSEConfig, ["checkpoint=runs/train_e2e/x"], "stages", "runs/train_e2e/x"),
            ("train_e2e", TrainE2EConfig, ["stage=encoder", "stages_dir=runs/train_e2e/x"], "stages",
             "runs/train_e2e/x"),
            ("finetune_stochastic", FinetuneStochasticConfig, ["stages_dir=runs/train_e2e/x"], "stages",
             "runs/train_e2e/x"),
            ("forecast", ForecastConfig, ["checkpoint=run", "routing_members=3"], "members", 3)]:
        got = getattr(prepare(job, cls, argv), key)
        assert got == value or str(got).endswith(str(value)), (job, got)
        old = argv[-1].split("=")[0]
        assert capsys.readouterr().out.splitlines() == [
            f"wxray: config key '{old}' is deprecated and will be removed: use '{key}'"], job
    with pytest.raises(ConfigError, match="config keys 'members_m' and 'members.M' are one key"):
        prepare("forecast_e2e", ForecastE2EConfig, ["members_m=3", "members.M=2"])
    ose = prepare("ose", OSEConfig, ["deny=[stations]"])
    assert ose.streams == ["stations"] and ose.deny == []
    assert "use 'streams'" in capsys.readouterr().out
