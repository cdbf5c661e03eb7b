"""A checkpoint's forecast, made, written and scored one way for both places that make one: the training
job's evaluation of its final checkpoint (evaluation.py) and the forecast job (forecast.py).

    model = load_forecaster(ckpt, model_cfg, spec)      # before the job starts: bad input is one line
    run = forecast_and_score(model, spec, ds, anchors, steps, out_dir, tracker, seed=..., batch_size=...)

`forecast_and_score` rolls the model out from `anchors` (rollout.py), writes `<out_dir>/forecast.zarr` in
the forecast convention and scores, per lead and beside persistence (`verify.lead_scores`), the inits whose
truth is in the store at every lead (`rollout_anchors`), logging those scores to MLflow. Its `report` is
the `rollout` entry of RESULT, {} when no init has that truth.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xarray as xr

from wxray.data.anchors import rollout_anchors
from wxray.data.schema import INIT, TIME, open_climatology
from wxray.data.windows import WindowSpec
from wxray.errors import ConfigError
from wxray.forecast import checkpoints
from wxray.forecast.rollout import rollout, to_forecast_dataset, write_forecast
from wxray.models.registry import ModelConfig, SamplerConfig, as_forecaster, build_forecaster, model_identity
from wxray.verify.lead_scores import log_report, rollout_report


def load_forecaster(ckpt: str | Path, model_cfg: ModelConfig, spec: WindowSpec,
                    sampler: SamplerConfig | None = None) -> torch.nn.Module:
    """The forecaster of `model_cfg` on `spec` with the weights of checkpoint `ckpt`, which must have been
    trained with that model and those channels (CheckpointError otherwise; ConfigError for a model that
    cannot be built on this grid). A generative model comes wrapped with `sampler` (default settings if None)."""
    state, _ = checkpoints.load(ckpt, expect_model=model_identity(model_cfg, spec))
    try:
        model = build_forecaster(model_cfg, spec)
    except ValueError as e:
        raise ConfigError(f"checkpoint {ckpt}: {e}") from None
    checkpoints.load_model_weights(model, state, str(ckpt))
    return as_forecaster(model, model_cfg, sampler or SamplerConfig())


@dataclass
class ForecastRun:
    forecast: xr.Dataset  # forecast convention, every init of `anchors`
    path: Path  # <out_dir>/forecast.zarr
    scored: np.ndarray  # the anchors with truth at every lead, the inits `report` scores
    report: dict[str, Any]  # verify.lead_scores.rollout_report of the scored inits; {} when there are none


def forecast_and_score(model: torch.nn.Module, spec: WindowSpec, ds: xr.Dataset, anchors: np.ndarray, steps: int,
                       out_dir: str | Path, tracker, *, seed: int, batch_size: int,
                       members: Sequence[int] | None = None, device: torch.device | str = "cpu",
                       attrs: dict[str, Any] | None = None) -> ForecastRun:
    """Rollout -> forecast.zarr (with `attrs`) -> per-lead scores logged to `tracker`; see the module docstring."""
    fc = rollout(model.to(device), spec, anchors, steps, seed=seed, batch_size=batch_size, members=members,
                 device=device)
    forecast = to_forecast_dataset(fc, spec, ds, anchors, members)
    forecast.attrs.update(attrs or {})
    path = write_forecast(forecast, Path(out_dir) / "forecast.zarr")
    scored = rollout_anchors(ds, anchors, spec, steps)
    report: dict[str, Any] = {}
    if len(scored):
        report = rollout_report(forecast.sel({INIT: ds[TIME].values[scored]}), ds, open_climatology(spec.store))
        log_report(report, tracker)
    return ForecastRun(forecast, path, scored, report)
