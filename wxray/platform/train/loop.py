"""`train_fn_per_worker`: the one loop every Ray Train worker runs, whatever it trains (a `tasks.Task`).

The driver hands every worker one `LoopSetup` (TorchTrainer's `train_loop_config={"setup": ...}`, built by
`trainer.make_trainer`). The worker's run (`worker.WorkerRun`: device, sharded module, optimiser, LR schedule,
resume, the step) walks the epochs; everything else around a step or an epoch is a hook (`hooks.py`):
interruption, the fault drill, step metrics and memory, validation, the console, the report and its
checkpoint, a sweep's early stop.
"""

from __future__ import annotations

from typing import Any

from wxray.platform.cluster import devices
from wxray.platform.train.hooks import default_hooks
from wxray.platform.train.worker import LoopSetup, WorkerRun


def _batch_starts(hooks: list, run: WorkerRun) -> bool:
    """Whether the next step runs: the hooks in order, until one stops the run."""
    for h in hooks:
        h.on_train_batch_start(run)
        if run.stopped:
            return False
    return True


def train_fn_per_worker(config: dict[str, Any]) -> None:
    import ray.train

    setup: LoopSetup = config["setup"]
    ctx = ray.train.get_context()
    shards = {"train": ray.train.get_dataset_shard("train"), "checkpoint": ray.train.get_checkpoint(),
              **({"val": ray.train.get_dataset_shard("val")} if setup.has_val else {})}
    run = WorkerRun(setup, ctx.get_world_rank(), ctx.get_world_size(), devices.worker_device(), shards)
    hooks = default_hooks(run)
    for epoch in range(run.start_epoch, setup.cfg.train.epochs):
        run.begin_epoch(epoch)
        for h in hooks:
            h.on_train_epoch_start(run)
        for batch, w, n_global in run.batches():
            if not _batch_starts(hooks, run):
                break
            run.train_step(batch, w, n_global)
            for h in hooks:
                h.on_train_batch_end(run)
        if run.stopped:  # an interrupted epoch is not complete: nothing of it is reported
            break
        metrics = run.epoch_metrics()
        for h in hooks:
            h.on_train_epoch_end(run, metrics)
        if run.stopped:
            break
