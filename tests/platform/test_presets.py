"""The paper presets (configs/paper/*.yaml) load as written and train for two steps on a tiny store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.mlflow_db import fresh_uri
from tests.tiny_store import write_tiny_store
from wxray.config import load_config
from wxray.job import run_job
from wxray.platform.train.config import TrainSparseConfig
from wxray.platform.train.sparse import train_sparse

PRESETS = sorted((Path(__file__).resolve().parents[2] / "configs" / "paper").glob("table*.yaml"))
STOCHASTIC = sorted((Path(__file__).resolve().parents[2] / "configs" / "paper").glob("stochastic_*.yaml"))


def test_presets_are_the_papers_base_setups():
    assert [p.name for p in PRESETS] == ["table1_direct.yaml", "table3_rollout.yaml"]
    for p in PRESETS:
        cfg = load_config(TrainSparseConfig, ["--config", str(p)])
        m, o, t = cfg.model, cfg.optim, cfg.train
        assert (m.embed_dim, m.depth, m.num_heads, tuple(m.split), m.keep_ratio) == (256, 12, 4, (2, 8, 2), 0.25)
        assert (o.lr, o.lr_scaling, o.warmup_epochs) == (5e-4, 0.8, 5.0)
        assert t.precision == "bf16" and t.fsdp and t.activation_checkpointing
        assert cfg.data.levels == [50, 250, 500, 600, 700, 850, 925] and cfg.data.history == 1
    direct = load_config(TrainSparseConfig, ["--config", str(PRESETS[0])])
    assert (direct.data.lead_steps, direct.data.residual, direct.train.rollout_steps) == (20, False, 1)
    rollout = load_config(TrainSparseConfig, ["--config", str(PRESETS[1])])
    assert (rollout.data.lead_steps, rollout.train.rollout_steps) == (4, 10)  # 24-h steps, days 1-10


def test_stochastic_presets_are_the_papers_recipe():
    from wxray.platform.train.stochastic import FinetuneStochasticConfig

    assert [p.name for p in STOCHASTIC] == ["stochastic_encoder.yaml", "stochastic_processor.yaml"]
    enc, proc = (load_config(FinetuneStochasticConfig, ["--config", str(p)]) for p in STOCHASTIC)
    assert (enc.stochastic.noise, enc.stochastic.members, enc.optim.lr, enc.train.epochs) == ("film", 7, 3e-5, 20)
    assert (proc.stochastic.dropout, proc.stochastic.members, proc.stochastic.leads) == (0.05, 7, 10)
    assert (proc.optim.lr, proc.optim.min_lr_ratio, proc.optim.weight_decay) == (1e-4, 0.01, 1e-5)  # -> 1e-6
    assert (proc.train.epochs, proc.stochastic.lead_epochs, proc.train.activation_checkpointing) == (20, 12, True)


@pytest.mark.slow
@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.stem)
def test_preset_trains_two_steps(ray_session, preset, tmp_path, capsys):
    store = tmp_path / "store.zarr"
    write_tiny_store(store, n_traj=2, steps=40, grid=(8, 16), levels=(500,))
    argv = ["--config", str(preset), f"data.store={store}", "data.input_variables=[geopotential,temperature]",
            "data.target_variables=[geopotential]" if "direct" in preset.stem else "data.target_variables=[]",
            "data.levels=[500]", "data.train_range=", "data.val_range=", "data.test_range=",
            "scaling.use_gpu=false", "scaling.num_workers=1", "train.epochs=1", "train.max_steps_per_epoch=2",
            "data.batch_size=2", f"out_dir={tmp_path / 'run'}", f"tracking.uri={fresh_uri(tmp_path)}"]
    rc = run_job("train_sparse", TrainSparseConfig, train_sparse, argv)
    cap = capsys.readouterr()
    assert rc == 0, cap.err[-2000:]
    result = json.loads([ln for ln in cap.out.splitlines() if ln.startswith("RESULT ")][-1][7:])
    assert result["steps"] == 2 and result["n_parameters"] > 9e6  # the Base model, not a toy
