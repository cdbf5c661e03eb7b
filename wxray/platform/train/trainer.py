"""The one `TorchTrainer` builder and the driver side of a training run, for every task of the loop.

    last = check_resume(out_dir, identity)      # before the job starts: a re-run's checkpoint must fit
    start_cluster(cfg)                          # Ray reachable, the workers fit (one line when they do not)
    setup = loop_setup(cfg, task, identity, ctx, ...)
    result = fit(setup, datasets, out_dir)      # Ray Train run; a worker's error is one line

Train + Tune: `loop.train_fn_per_worker` <- `make_trainer` (here) <- a job driver (`sparse.train_sparse`,
`e2e.fit_stage`), which a Tune trial calls with its callbacks and decision folder.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from wxray import errors
from wxray.config import to_dict
from wxray.errors import CheckpointError, WxrayError
from wxray.forecast import checkpoints
from wxray.job import JobContext
from wxray.platform.cluster import resources, session
from wxray.platform.train import storage
from wxray.platform.train.datasets import exactly_once_data_config
from wxray.platform.train.interrupt import StopFlag, graceful_sigint
from wxray.platform.train.loop import train_fn_per_worker
from wxray.platform.train.reporting import ProgressPrinter
from wxray.platform.train.tasks import Task
from wxray.platform.train.worker import LoopSetup


def check_resume(out_dir: Path, identity: dict[str, Any], storage_root: str = "") -> Path | str | None:
    """A re-run into an existing run directory (or its folder under `train.storage`) resumes from its newest
    checkpoint: check it fits first."""
    where = storage.ray_location(storage_root, out_dir)
    storage.check(storage_root)
    last = checkpoints.latest(where)
    if last is not None:
        checkpoints.read_meta(last, expect_model=identity)
    return last


def start_cluster(cfg) -> None:
    """Join or start Ray (`ray_address`, `ray_timeout_s`) and check that the workers (`scaling`) and the read
    tasks (`data.read_cpus`) fit: every training job's config has these keys."""
    session.ensure_ray(cfg.ray_address, timeout_s=cfg.ray_timeout_s)
    resources.check_cluster_fits(cfg.scaling, reserve_cpus=cfg.data.read_cpus)


def loop_setup(cfg, task: Task, identity: dict[str, Any], ctx: JobContext, *, n_train: int, has_val: bool,
               example: dict, out_dir: Path, decisions: str = "", resume_from: Path | str | None = None) -> LoopSetup:
    """The workers' `LoopSetup`; every checkpoint's meta.json records the data config with the store used, the
    normalisation and the run's provenance beside the model identity."""
    meta = {"data": {**to_dict(cfg.data), "store": task.spec.store},
            checkpoints.NORMALISATION: checkpoints.normalisation_meta(task.spec),
            checkpoints.PROVENANCE: ctx.provenance}
    return LoopSetup(cfg, task, identity, meta, n_train, has_val, example, str(Path(out_dir).resolve()),
                     ctx.tracker.uri, ctx.tracker.run_id or "", decisions=decisions, resume_from=str(resume_from or ""))


def make_trainer(setup: LoopSetup, datasets: dict[str, Any], out_dir: Path,
                 callbacks: list | None = None):
    """The `TorchTrainer` of a training run; Ray Train's storage is `<out_dir>/ray` (or the run's folder under
    `train.storage`, storage.py), run name `train`, so a re-run into the same directory (a resumed job, a
    restored Tune trial) finds its checkpoints.
    `callbacks`: Ray Train callbacks (a Tune trial passes TuneReportCallback)."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig
    from ray.train.torch import TorchTrainer

    cfg = setup.cfg
    storage_path, storage_fs = storage.ray_storage(cfg.train.storage, out_dir)
    return TorchTrainer(
        train_fn_per_worker,
        train_loop_config={"setup": setup},
        scaling_config=resources.ray_scaling_config(cfg.scaling),  # pinned to cfg.scaling.vendor's nodes
        torch_config=resources.torch_config(cfg.scaling),  # GPU runs that may land on AMD: the ROCm device fix
        run_config=RunConfig(
            name="train", storage_path=storage_path, storage_filesystem=storage_fs,
            failure_config=FailureConfig(max_failures=cfg.train.max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=cfg.train.keep_checkpoints),
            callbacks=callbacks,
        ),
        datasets={k: v for k, v in datasets.items() if k in ("train", "val")},
        dataset_config=exactly_once_data_config(),
    )


def fit(setup: LoopSetup, datasets: dict[str, Any], out_dir: Path, callbacks: list | None = None):
    """Run the training on Ray Train with the workers' console lines shown here; a failure is one line
    (`training_error`), a run without a checkpoint a CheckpointError, Ctrl-C a stop at the next step
    (`interrupt`) and then KeyboardInterrupt."""

    flag = StopFlag()
    with ProgressPrinter() as progress:
        trainer = make_trainer(dataclasses.replace(setup, progress=progress.queue, stop=flag), datasets, out_dir,
                               callbacks)
        with graceful_sigint(trainer, flag) as sigint:
            try:
                result = trainer.fit()
            except Exception as e:  # Ray wraps worker errors; show the cause in one line
                raise training_error(e) from None
    checkpoints.prune(storage.ray_location(setup.cfg.train.storage, out_dir), setup.cfg.train.keep_checkpoints)
    if sigint.stopped:  # the workers stopped at a step: the job ends as interrupted (exit 130, MLflow KILLED)
        raise KeyboardInterrupt
    if result.checkpoint is None:
        label = f"stage {setup.task.label} " if setup.task.label else "training "
        raise CheckpointError(f"{label}in {out_dir} finished without a checkpoint")
    return result


def training_error(e: BaseException) -> WxrayError:
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
    for text in texts:
        found = re.search(r"wxray\.errors\.(\w+): ([^\n]+)", text)
        if found:
            cls = getattr(errors, found.group(1), WxrayError)
            return (cls if isinstance(cls, type) and issubclass(cls, WxrayError) else WxrayError)(found.group(2))
    return WxrayError(f"training failed: {_first_line(e)}")


def _first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip() and not ln.startswith("Traceback")]
    if len(lines) > 1 and lines[0] == "Failed to set up runtime environment.":
        return f"{lines[0]} {lines[1]}"  # Ray's RuntimeEnvSetupError says why on its second line
    return lines[0] if lines else type(e).__name__


def figures(metrics: dict[str, Any], prefix: str) -> dict[str, float]:
    """The metrics under `prefix`, six significant digits, never rounded to zero (a vorticity RMSE of
    3e-6 s-1 must not read 0.0)."""
    return {k[len(prefix):]: float(f"{float(v):.6g}") for k, v in metrics.items() if k.startswith(prefix)}
