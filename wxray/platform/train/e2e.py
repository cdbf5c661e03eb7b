"""The driver of `jobs/train_e2e.py`: one stage of the end-to-end system as a Ray Train run, then its scores.

Everything is checked before Ray starts (store, streams, configs, the earlier stages a stage needs). The
processor stage is the forecaster's job (`sparse.train_sparse`, history 1) so it keeps every feature of
it; encoder, decoder and chain are `stage_task.StageTask`s of the same loop (`loop.train_fn_per_worker`).
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

from wxray.console import say
from wxray.data import location
from wxray.data.e2e_windows import E2EData, E2EReader, prepare_e2e
from wxray.data.obs.windows import check_reports
from wxray.data.schema import TIME
from wxray.data.window_data import DataConfig
from wxray.data.windows import open_lazy
from wxray.errors import CheckpointError, ConfigError, DataError
from wxray.forecast import checkpoints
from wxray.forecast.stages import build_stage_model, stage_identity
from wxray.job import JobContext
from wxray.models.registry import model_identity
from wxray.platform.train import trainer
from wxray.platform.train.config import TrainSparseConfig
from wxray.platform.train.datasets import build_e2e_datasets
from wxray.platform.train.sparse import train_sparse
from wxray.platform.train.stage_config import TrainE2EConfig
from wxray.platform.train.stage_eval import evaluate_stage
from wxray.platform.train.stage_task import StageTask
from wxray.platform.train.tasks import VAL_RMSE, Task
from wxray.provenance import store_fingerprint, stream_fingerprint


def stage_checkpoint(cfg: TrainE2EConfig, stage: str, needed_by: str) -> Path:
    """The newest checkpoint of an earlier stage of this chain (CheckpointError naming what to run)."""
    d = Path(cfg.stages) / stage
    last = checkpoints.latest(d / "ray")
    if last is None:
        name = cfg.run_name or "e2e"
        raise CheckpointError(f"stage {needed_by} needs the {stage} stage first: no checkpoint under {d} "
                              f"(run jobs/train_e2e.py stage={stage} run_name={name})")
    return last


def processor_config(cfg: TrainE2EConfig) -> TrainSparseConfig:
    data = DataConfig(**{f.name: getattr(cfg.data, f.name) for f in fields(DataConfig)})
    return TrainSparseConfig(out_dir=cfg.out_dir, run_name=cfg.run_name, tracking=cfg.tracking, data=data,
                             model=cfg.processor, optim=cfg.optim, train=cfg.train, scaling=cfg.scaling,
                             ray_address=cfg.ray_address, ray_timeout_s=cfg.ray_timeout_s)


def initial_weights(cfg: TrainE2EConfig, data: E2EData) -> dict[str, str]:
    """Chain: the encoder and processor stages' checkpoints, checked against this run's model configs."""
    if cfg.stage != "chain":
        return {}
    enc = stage_checkpoint(cfg, "encoder", "chain")
    proc = stage_checkpoint(cfg, "processor", "chain")
    checkpoints.read_meta(enc, expect_model=stage_identity(cfg, data, "encoder"))
    checkpoints.read_meta(proc, expect_model=model_identity(cfg.processor, data.spec))
    return {"encoder": str(enc), "processor": str(proc)}


def train_e2e(cfg: TrainE2EConfig, ctx: JobContext) -> dict[str, Any]:
    if cfg.encoder.patch_size != cfg.processor.patch_size:
        raise ConfigError(f"encoder.patch_size={cfg.encoder.patch_size} and processor.patch_size="
                          f"{cfg.processor.patch_size} must agree: the analysis is the processor's input grid")
    if cfg.stage == "processor":
        return train_sparse(processor_config(cfg), ctx)
    data = prepare_e2e(cfg.data, cfg.encoder.patch_size)
    train_times = open_lazy(data.spec.store)[TIME].values[data.windows.anchors["train"]]
    check_reports(data.obs, train_times, "the training split")
    try:
        build_stage_model(cfg, data)
    except ValueError as e:
        raise ConfigError(f"{cfg.stage}: {e}") from None
    task = StageTask(cfg, data, initial_weights(cfg, data))
    result, metrics = fit_stage(cfg, data, ctx, stage_identity(cfg, data), task)
    with result.checkpoint.as_directory() as d:
        scores = evaluate_stage(cfg, data, Path(d), Path(ctx.out_dir), ctx.tracker)
    return {**stage_summary(cfg.stage, result, metrics, ctx, data), **scores}


def stage_summary(stage: str, result, metrics: dict, ctx: JobContext, data: E2EData) -> dict[str, Any]:
    return {"stage": stage, "val_rmse": trainer.figures(metrics, VAL_RMSE), "val_loss": metrics.get("val/loss"),
            "train_loss": metrics.get("train/epoch_loss"), "epochs": int(metrics.get("epoch", 0)),
            "checkpoint": str(Path(result.checkpoint.path).resolve()), "n_parameters": metrics.get("n_parameters"),
            "windows": data.counts()}


def fit_stage(cfg, data: E2EData, ctx: JobContext, identity: dict, task: Task, out_dir: Path | None = None):
    """Check, start the job, fit `task` on Ray Train; returns (Ray result, final metrics + n_parameters).

    `out_dir` is the run's Ray storage parent (default the job's run directory); the console names the stage
    by `task.label`."""
    label = task.label
    if "train" not in data.windows.anchors or not len(data.windows.anchors["train"]):
        raise DataError(f"store {cfg.data.store}: no valid training windows (check data.*_range)")
    out_dir = Path(out_dir or cfg.out_dir)
    last = trainer.check_resume(out_dir, identity)
    model = task.build()
    example = E2EReader(data.spec, data.obs)({"anchor": data.windows.anchors["train"][:1]})
    trainer.start_cluster(cfg)
    ctx.provenance["store"] = store_fingerprint(data.spec.store)
    # a URL obs dir keeps its scheme (fingerprinted by its path, "unknown" hash: nothing is listed remotely)
    paths = {s.name: location.join(data.obs.obs_dir, s.path) for s in data.obs.streams}
    hashed = {p: stream_fingerprint(p) for p in set(paths.values())}  # point streams share one dataset
    ctx.provenance["obs_streams"] = {name: hashed[p] for name, p in paths.items()}
    ctx.start()
    if last is not None:
        say(f"resuming from {last}")
    n_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    counts = data.counts()
    ctx.tracker.log_params({f"{label}.n_parameters": n_params,
                            "streams": ",".join(s.name for s in data.obs.streams),
                            **{f"windows.{k}": v for k, v in counts.items()}})
    say(f"stage {label}: {n_params / 1e6:.2f}M trained parameters, streams "
        f"{', '.join(s.name for s in data.obs.streams)}, windows {counts}, run directory {out_dir}")
    ctx.keep_on_failure = True
    datasets = build_e2e_datasets(cfg.data, data)
    setup = trainer.loop_setup(cfg, task, identity, ctx, n_train=len(data.windows.anchors["train"]),
                               has_val="val" in datasets, example=example, out_dir=out_dir, resume_from=last)
    result = trainer.fit(setup, datasets, out_dir)
    return result, {**(result.metrics or {}), "n_parameters": n_params}
