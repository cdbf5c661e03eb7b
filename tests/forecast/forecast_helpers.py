"""Shared by the forecast job's tests: their store, a checkpoint saved as training saves it, a job run captured."""

from __future__ import annotations

import json

import numpy as np
import torch

from tests.tiny_store import write_tiny_store
from wxray.config import to_dict
from wxray.data.schema import open_stats, open_store
from wxray.data.window_data import DataConfig
from wxray.data.windows import fit_spec, make_spec
from wxray.forecast import checkpoints
from wxray.job import run_job
from wxray.models.registry import ModelConfig, build_forecaster, model_identity

TRAJECTORY_1 = "2000-01-01T06/2000-01-04T06"  # every init of the first trajectory with truth 12 h ahead


def write_forecast_store(path):
    """The forecast tests' store: two trajectories of 16 steps on a 9 x 16 grid (9 rows: patch 2 needs the fit)."""
    write_tiny_store(path, n_traj=2, steps=16, grid=(9, 16), levels=(500,))
    return path


def configs(store, grid_fit: str, **model_kw):
    data = DataConfig(store=str(store), history=2, lead_steps=1, levels=[500], grid_fit=grid_fit)
    model = ModelConfig(embed_dim=16, depth=3, num_heads=2, split=(1, 1, 1), keep_ratio=0.5, skip_channels=8,
                        **model_kw)
    return data, model


def spec_of(store, data, model):
    return fit_spec(make_spec(str(store), open_store(store), open_stats(store), data), model.patch_size,
                    data.grid_fit)


def save_checkpoint(directory, store, grid_fit="crop", data_in_meta=True, normalisation=True, **kw):
    """A freshly initialised model saved as training saves it (faster than training one); without
    `data_in_meta` / `normalisation` as checkpoints written before meta.json kept them."""
    data, model_cfg = configs(store, grid_fit, **kw)
    spec = spec_of(store, data, model_cfg)
    torch.manual_seed(0)
    model = build_forecaster(model_cfg, spec)
    meta = {"model": model_identity(model_cfg, spec), "epoch": 1, "step": 1}
    if data_in_meta:
        meta["data"] = {**to_dict(data), "store": spec.store}
    if normalisation:
        meta[checkpoints.NORMALISATION] = checkpoints.normalisation_meta(spec)
    return checkpoints.save(directory, {"model": model.state_dict()}, meta), model, spec


def run_captured(capsys, job, cfg_cls, main, argv):
    """(exit code, the RESULT line's JSON or None, stderr) of one job run in this process."""
    rc = run_job(job, cfg_cls, main, argv)
    cap = capsys.readouterr()
    results = [line for line in cap.out.splitlines() if line.startswith("RESULT ")]
    return rc, (json.loads(results[-1][7:]) if results else None), cap.err


def anchors_of(store, fc) -> np.ndarray:
    """The store time index of each init of forecast `fc`."""
    times = open_store(store).time.values
    return np.array([int(np.flatnonzero(times == t)[0]) for t in fc.init_time.values])
