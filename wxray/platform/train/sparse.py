"""The driver of `jobs/train_sparse.py`: checks everything up front, trains the forecaster (a
`tasks.ForecasterTask` of the one loop) on Ray Train, then evaluates the final checkpoint (autoregressive
rollout on the test split, a validation map).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from wxray.console import say
from wxray.data.window_data import WindowData, prepare_windows
from wxray.data.windows import WindowReader, fit_spec
from wxray.errors import ConfigError, DataError
from wxray.forecast import checkpoints, mlflow_model
from wxray.job import JobContext
from wxray.models.registry import build_forecaster, model_identity
from wxray.platform.train import storage, trainer
from wxray.platform.train.config import TrainSparseConfig
from wxray.platform.train.datasets import build_datasets
from wxray.platform.train.evaluation import evaluate_checkpoint
from wxray.platform.train.tasks import VAL_RMSE, ForecasterTask
from wxray.provenance import store_fingerprint


def check_model(cfg: TrainSparseConfig, data: WindowData) -> torch.nn.Module:
    names = [c.name for c in data.spec.targets]
    for name in cfg.train.var_weights:
        if name not in names:
            raise ConfigError(f"train.var_weights names '{name}', not a target channel "
                              f"(channels: {', '.join(names)})")
    data.spec = fit_spec(data.spec, cfg.model.patch_size, cfg.data.grid_fit)  # crop/pad/refuse the grid
    try:
        model = build_forecaster(cfg.model, data.spec)
    except ValueError as e:
        raise ConfigError(f"model: {e}") from None
    if cfg.train.init_from:
        state, _ = checkpoints.load(cfg.train.init_from, expect_model=model_identity(cfg.model, data.spec))
        checkpoints.load_model_weights(model, state, cfg.train.init_from)
    return model


def forecaster_task(cfg: TrainSparseConfig, data: WindowData) -> ForecasterTask:
    t = cfg.train
    return ForecasterTask(cfg.model, data.spec, cfg.sampler, dict(t.var_weights), t.init_from,
                          t.activation_checkpointing, t.seed)


def train_sparse(cfg: TrainSparseConfig, ctx: JobContext, callbacks: list | None = None,
                 decisions: str = "") -> dict[str, Any]:
    """The training job; a Tune trial passes `callbacks` (TuneReportCallback) and `decisions` (the folder of
    its scheduler's stop/continue decisions, `reporting.stop_requested`)."""
    data = prepare_windows(cfg.data)  # no Ray needed yet: bad data fail before any worker starts
    model = check_model(cfg, data)
    if not len(data.anchors["train"]):
        raise DataError(f"store {cfg.data.store}: no valid training windows (check data.*_range and history)")
    identity = model_identity(cfg.model, data.spec)
    resumed_from = trainer.check_resume(Path(cfg.out_dir), identity, cfg.train.storage)
    trainer.start_cluster(cfg)
    ctx.provenance["store"] = store_fingerprint(data.spec.store)
    if cfg.train.storage:
        ctx.mirror = storage.run_location(cfg.train.storage, cfg.out_dir)
    ctx.start()  # every input is checked: only now does the run directory change
    if resumed_from is not None:
        say(f"resuming from {resumed_from}")
    if ctx.mirror:
        say(f"checkpoints and a copy of the run go to {ctx.mirror}")
    n_params = sum(p.numel() for p in model.parameters())
    counts = data.counts()
    ctx.tracker.log_params({"n_parameters": n_params, **{f"windows.{k}": v for k, v in counts.items()}})
    say(f"{cfg.model.name} r={cfg.model.keep_ratio:g}, {n_params / 1e6:.2f}M parameters, windows {counts}, "
        f"grid {data.spec.grid[0]}x{data.spec.grid[1]}, {cfg.scaling.describe()}; run directory "
        f"{ctx.out_dir}")
    ctx.keep_on_failure = True  # checkpoints written from here on are what a re-run resumes from
    datasets, _ = build_datasets(cfg.data, data)
    example = WindowReader(data.spec)({"anchor": data.anchors["train"][:1]})
    setup = trainer.loop_setup(cfg, forecaster_task(cfg, data), identity, ctx, n_train=len(data.anchors["train"]),
                               has_val="val" in datasets, example=example, out_dir=Path(ctx.out_dir),
                               decisions=decisions, resume_from=resumed_from)
    result = trainer.fit(setup, datasets, Path(ctx.out_dir), callbacks)
    metrics = result.metrics or {}
    with result.checkpoint.as_directory() as d:
        evaluation = evaluate_checkpoint(cfg, data, Path(d), Path(ctx.out_dir), ctx)
        registered = register(cfg, ctx, Path(d), example)
    return {
        "val_rmse": trainer.figures(metrics, VAL_RMSE),
        "val_loss": metrics.get("val/loss"),
        "train_loss": metrics.get("train/epoch_loss"),
        "samples_per_s_per_worker": metrics.get("train/epoch_samples_per_s_per_worker"),
        "epochs": int(metrics.get("epoch", 0)),
        "steps": metrics.get("step"),
        "checkpoint": storage.checkpoint_url(cfg.train.storage, result.checkpoint.path),
        "n_parameters": n_params,
        "windows": counts,
        **evaluation,
        **registered,
    }


def register(cfg: TrainSparseConfig, ctx: JobContext, checkpoint: Path, example: dict) -> dict[str, Any]:
    """The final checkpoint as the run's MLflow model, registered unless register_model=false."""
    if not ctx.tracker.enabled:
        return {}
    name = (cfg.registered_model or f"wxray-{cfg.model.name}") if cfg.register_model else ""
    config = (Path(ctx.out_dir) / "config.yaml").read_text()
    block = mlflow_model.log_model(ctx.tracker, name, cfg.model.name, config, checkpoint=checkpoint, example=example)
    if "uri" in block:
        say(f"registered the final checkpoint as MLflow model {block['uri']} (forecast with checkpoint={block['uri']})")
    return {"mlflow_model": block}
