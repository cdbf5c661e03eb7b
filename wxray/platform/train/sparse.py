"""The driver of `jobs/train_sparse.py`: checks everything up front, builds the `TorchTrainer`, runs it,
then evaluates the final checkpoint (autoregressive rollout on the test split, a validation map).

Train+Tune pattern: `train_fn_per_worker` (trainer_loop.py) <- `make_trainer` (here) <- a Tune driver
function can call `make_trainer` per trial.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from wxray.config import to_dict
from wxray.data.window_data import WindowData, prepare_windows
from wxray.data.windows import fit_spec
from wxray.errors import CheckpointError, ConfigError, DataError, WxrayError
from wxray.job import JobContext, say
from wxray.models.registry import build_forecaster, model_identity
from wxray.platform.cluster import resources, session
from wxray.platform.train import checkpoints
from wxray.platform.train.config import TrainSparseConfig
from wxray.platform.train.datasets import build_datasets, exactly_once_data_config
from wxray.platform.train.evaluation import evaluate_checkpoint
from wxray.platform.train.loop import train_fn_per_worker
from wxray.platform.train.reporting import ProgressPrinter
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


def make_trainer(cfg: TrainSparseConfig, data: WindowData, out_dir: Path, tracking_uri: str = "",
                 mlflow_run_id: str = "", progress=None, callbacks: list | None = None, decisions: str = "",
                 provenance: dict | None = None):
    """The `TorchTrainer` of a training run; Ray Train's storage is `<out_dir>/ray`, run name `train`, so a
    re-run into the same directory (a resumed job, a restored Tune trial) finds its checkpoints.
    `callbacks`: Ray Train callbacks (a Tune trial passes TuneReportCallback); `decisions`: the folder
    where a sweep's scheduler leaves its stop/continue decision after each epoch (reporting.stop_requested);
    `provenance`: the run's (JobContext.provenance), kept in every checkpoint's meta.json."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig
    from ray.train.torch import TorchTrainer

    datasets, _ = build_datasets(cfg.data, data)
    if "train" not in datasets:
        raise DataError(f"store {cfg.data.store}: no valid training windows (check data.*_range and history)")
    loop_config = {"cfg": to_dict(cfg), "spec": data.spec, "n_train": len(data.anchors["train"]),
                   "has_val": "val" in datasets, "out_dir": str(out_dir.resolve()),
                   "model_identity": model_identity(cfg.model, data.spec),
                   "tracking_uri": tracking_uri, "mlflow_run_id": mlflow_run_id, "progress": progress,
                   "decisions": decisions, "provenance": provenance}
    return TorchTrainer(
        train_fn_per_worker,
        train_loop_config=loop_config,
        scaling_config=resources.ray_scaling_config(cfg.scaling),  # pinned to cfg.scaling.vendor's nodes
        torch_config=resources.torch_config(cfg.scaling),  # GPU runs that may land on AMD: the ROCm device fix
        run_config=RunConfig(
            name="train", storage_path=str((out_dir / "ray").resolve()),
            failure_config=FailureConfig(max_failures=cfg.train.max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=cfg.train.keep_checkpoints),
            callbacks=callbacks,
        ),
        datasets={k: v for k, v in datasets.items() if k in ("train", "val")},
        dataset_config=exactly_once_data_config(),
    )


def _training_error(e: BaseException) -> WxrayError:
    """The one-line cause of a failed Ray Train run.

    Ray wraps a worker's exception several times (TrainingFailedError -> WorkerGroupError.worker_failures
    -> UserExceptionWithTraceback._base_exc; RayTaskError.cause for Ray Data read tasks). A WxrayError
    found inside keeps its own message; anything else is reported by its first line.
    Errors from Ray Data read tasks arrive as UserCodeException without their cause; their traceback text
    still names the wxray error, which is then recovered from the text.
    """
    stack, seen, texts = [e], set(), []
    while stack:
        c = stack.pop()
        if c is None or id(c) in seen:
            continue
        seen.add(id(c))
        inner = [getattr(c, "cause", None), getattr(c, "_base_exc", None),
                 getattr(c, "controller_failure", None), c.__cause__]
        for attr in ("worker_failures", "errors"):
            failures = getattr(c, attr, None)
            if isinstance(failures, dict):
                inner.extend(failures.values())
        if isinstance(c, WxrayError) and not any(isinstance(i, BaseException) for i in inner[:2]):
            return type(c)(_first_line(c))
        texts += [str(c), str(getattr(c, "_traceback_str", ""))]
        stack.extend(i for i in inner if isinstance(i, BaseException))
    import wxray.errors

    for text in texts:
        found = re.search(r"wxray\.errors\.(\w+): ([^\n]+)", text)
        if found:
            cls = getattr(wxray.errors, found.group(1), WxrayError)
            return (cls if isinstance(cls, type) and issubclass(cls, WxrayError) else WxrayError)(found.group(2))
    return WxrayError(f"training failed: {_first_line(e)}")


def _first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip() and not ln.startswith("Traceback")]
    return lines[0] if lines else type(e).__name__


def check_resume(cfg: TrainSparseConfig, data: WindowData, out_dir: Path) -> Path | None:
    """A re-run into an existing run directory resumes from its newest checkpoint: check it fits first."""
    last = checkpoints.latest(out_dir / "ray")
    if last is not None:
        checkpoints.read_meta(last, expect_model=model_identity(cfg.model, data.spec))
    return last


def _figures(metrics: dict[str, Any], prefix: str) -> dict[str, float]:
    # Six significant digits, never rounded to zero: a vorticity RMSE of 3e-6 s-1 must not read 0.0.
    return {k[len(prefix):]: float(f"{float(v):.6g}") for k, v in metrics.items() if k.startswith(prefix)}


def train_sparse(cfg: TrainSparseConfig, ctx: JobContext, callbacks: list | None = None,
                 decisions: str = "") -> dict[str, Any]:
    """The training job; a Tune trial passes `callbacks` (TuneReportCallback) and `decisions` (make_trainer)."""
    data = prepare_windows(cfg.data)  # no Ray needed yet: bad data fail before any worker starts
    model = check_model(cfg, data)
    session.ensure_ray(cfg.ray_address, timeout_s=cfg.ray_timeout_s)
    resources.check_cluster_fits(cfg.scaling, reserve_cpus=cfg.data.read_cpus)
    resumed_from = check_resume(cfg, data, Path(cfg.out_dir))
    ctx.provenance["store"] = store_fingerprint(data.spec.store)
    ctx.start()  # every input is checked: only now does the run directory change
    if resumed_from is not None:
        say(f"resuming from {resumed_from}")
    n_params = sum(p.numel() for p in model.parameters())
    counts = data.counts()
    ctx.tracker.log_params({"n_parameters": n_params, **{f"windows.{k}": v for k, v in counts.items()}})
    say(f"{cfg.model.name} r={cfg.model.keep_ratio:g}, {n_params / 1e6:.2f}M parameters, windows {counts}, "
        f"grid {data.spec.grid[0]}x{data.spec.grid[1]}, {cfg.scaling.describe()}; run directory "
        f"{ctx.out_dir}")
    ctx.keep_on_failure = True  # checkpoints written from here on are what a re-run resumes from
    with ProgressPrinter() as progress:
        trainer = make_trainer(cfg, data, Path(ctx.out_dir), ctx.tracker.uri, ctx.tracker.run_id or "",
                               progress=progress.queue, callbacks=callbacks, decisions=decisions,
                               provenance=ctx.provenance)
        try:
            result = trainer.fit()
        except Exception as e:  # Ray wraps worker errors; show the cause in one line
            raise _training_error(e) from None
    if result.checkpoint is None:
        raise CheckpointError(f"training in {ctx.out_dir} finished without a checkpoint")
    metrics = result.metrics or {}
    with result.checkpoint.as_directory() as d:
        evaluation = evaluate_checkpoint(cfg, data, Path(d), Path(ctx.out_dir), ctx)
    return {
        "val_rmse": _figures(metrics, "val/rmse/"),
        "val_loss": metrics.get("val/loss"),
        "train_loss": metrics.get("train/epoch_loss"),
        "samples_per_s_per_worker": metrics.get("train/epoch_samples_per_s_per_worker"),
        "epochs": int(metrics.get("epoch", 0)),
        "steps": metrics.get("step"),
        "checkpoint": str(Path(result.checkpoint.path).resolve()),
        "n_parameters": n_params,
        "windows": counts,
        **evaluation,
    }
