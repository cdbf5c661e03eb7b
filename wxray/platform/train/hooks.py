"""What happens around a training step or an epoch, one concern per hook, at Lightning's hook points:

    on_train_epoch_start(run)             before the epoch's first batch
    on_train_batch_start(run)             before each step; a hook may set `run.stopped`: the epoch ends there
                                          (the hooks after it are not called for that batch)
    on_train_batch_end(run)               after each step (`run.last`: what the step gave)
    on_train_epoch_end(run, metrics)      after a complete epoch: add to `metrics`, print, report, or set
                                          `run.stopped` to end the run after this epoch

`run` is the worker's `worker.WorkerRun`. Every rank calls every hook at the same points, in the order of
`default_hooks`, so a hook may hold a collective (the interruption poll, validation, the checkpoint, the
sweep's decision). A new concern of the loop (step checkpoints, a device mesh's bookkeeping) is a new hook.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from wxray.forecast import checkpoints
from wxray.platform.cluster import memory
from wxray.platform.train.interrupt import StopPoll
from wxray.platform.train.reporting import stop_requested
from wxray.platform.train.resume import get_state
from wxray.platform.train.worker import WorkerRun


class Hook:
    """One concern of the loop; every hook point does nothing unless overridden."""

    def on_train_epoch_start(self, run: WorkerRun) -> None:
        pass

    def on_train_batch_start(self, run: WorkerRun) -> None:
        pass

    def on_train_batch_end(self, run: WorkerRun) -> None:
        pass

    def on_train_epoch_end(self, run: WorkerRun, metrics: dict[str, Any]) -> None:
        pass


class Interruption(Hook):
    """Ctrl-C on the driver (`interrupt.py`): every rank leaves the epoch at the same step, which is not
    checkpointed (the newest checkpoint is the last complete epoch)."""

    def __init__(self, flag, rank: int, world: int):
        self.poll = StopPoll(flag, rank, world)

    def on_train_batch_start(self, run: WorkerRun) -> None:
        if self.poll(run.device):
            run.stopped = True
            run.say(f"{run.label}stopped in epoch {run.epoch + 1} at step {run.step}: the newest checkpoint is "
                    f"{'after epoch ' + str(run.epoch) if run.epoch else 'none'}")


class FaultDrill(Hook):
    """`train.fault_drill_epoch`: one worker dies abruptly at that epoch's second step, once, as when a node is
    lost (the elastic tests restart the run from its newest checkpoint)."""

    def __init__(self, epoch: int | None, out_dir: str):
        self.epoch, self.marker = epoch, Path(out_dir) / ".fault_drill_done"

    def on_train_batch_start(self, run: WorkerRun) -> None:
        if (run.batch == 1 and self.epoch == run.epoch and run.rank == min(1, run.world - 1)
                and not self.marker.exists()):
            self.marker.write_text(f"killed rank {run.rank} at the start of epoch {run.epoch}\n")
            os._exit(1)


class StepMetrics(Hook):
    """Every `train.log_every` steps: loss, LR, step time, throughput and memory to MLflow (rank 0); the
    epoch's largest saved-activation count and the device's peak memory in the epoch's metrics."""

    def __init__(self, log_every: int, model: torch.nn.Module, captured: bool):
        self.log_every, self.captured = log_every, captured
        self.exclude = memory.SavedActivationMeter.parameter_pointers(model)
        self.t0, self.act_bytes = 0.0, 0

    def on_train_epoch_start(self, run: WorkerRun) -> None:
        memory.reset_peak_memory(run.device)
        self.act_bytes = 0

    def on_train_batch_start(self, run: WorkerRun) -> None:
        self.t0 = time.perf_counter()
        measure = run.step % self.log_every == 0
        run.meter = memory.SavedActivationMeter(self.exclude) if measure else None

    def on_train_batch_end(self, run: WorkerRun) -> None:
        meter, out = run.meter, run.last
        if meter is None:
            return
        dt = time.perf_counter() - self.t0
        m = {"train/loss": out.loss.item() / out.w if out.w else float("nan"),
             **({"train/selector_loss": out.aux.item()} if out.aux is not None and out.w else {}),
             "train/lr": out.lr, "train/step_time_s": dt, "train/samples_per_s_per_worker": out.n / dt,
             **({} if self.captured else {"train/saved_activation_bytes": meter.bytes})}  # a replay saves none
        self.act_bytes = max(self.act_bytes, meter.bytes)
        peak = memory.peak_memory_bytes(run.device)
        if peak is not None:
            m["train/peak_memory_bytes"] = peak
        run.reporter.log(m, run.step)

    def on_train_epoch_end(self, run: WorkerRun, metrics: dict[str, Any]) -> None:
        if not self.captured:
            metrics["train/epoch_saved_activation_bytes"] = self.act_bytes  # the largest this epoch
        peak = memory.peak_memory_bytes(run.device)
        if peak is not None:
            metrics["train/epoch_peak_memory_bytes"] = peak


class Validation(Hook):
    """The task's validation on the worker's shard of the validation split, after every epoch."""

    def __init__(self, shard):
        self.shard = shard

    def on_train_epoch_end(self, run: WorkerRun, metrics: dict[str, Any]) -> None:
        cfg = run.cfg
        batches = self.shard.iter_torch_batches(batch_size=cfg.data.batch_size, device=run.device)
        metrics.update(run.task.validate(run.model, batches, run.lat_w, run.device, run.world, run.dtype, run.dummy,
                                         final=run.epoch == cfg.train.epochs - 1))


class Console(Hook):
    """One console line per epoch (rank 0): step, losses, throughput."""

    def on_train_epoch_end(self, run: WorkerRun, metrics: dict[str, Any]) -> None:
        val = f", val loss {metrics['val/loss']:.4f}" if "val/loss" in metrics else ""
        run.say(f"{run.label}epoch {run.epoch + 1}/{run.cfg.train.epochs}: step {run.step}, "
                f"train loss {metrics['train/epoch_loss']:.4f}{val}, "
                f"{metrics['train/epoch_samples_per_s_per_worker']:.1f} samples/s/worker")


class Report(Hook):
    """The per-epoch report to Ray Train (a barrier) and MLflow, with a checkpoint every `checkpoint_every`
    epochs and after the last: model, optimiser, schedule position and RNG state (rank 0 writes it; every rank
    takes part in gathering the state)."""

    def __init__(self, meta: dict[str, Any]):
        self.meta = meta

    def on_train_epoch_end(self, run: WorkerRun, metrics: dict[str, Any]) -> None:
        import ray.train

        cfg, epoch = run.cfg, run.epoch
        if (epoch + 1) % cfg.train.checkpoint_every and epoch != cfg.train.epochs - 1:
            run.reporter.report(metrics, run.step)
            return
        model_sd, opt_sd = get_state(run.module, run.opt)
        with tempfile.TemporaryDirectory() as tmp:
            ckpt = None
            if run.rank == 0:
                state = {"model": model_sd, "optimizer": opt_sd, "samples_seen": run.seen,
                         "next_epoch": epoch + 1, "step": run.step, "torch_rng": torch.get_rng_state()}
                checkpoints.save(tmp, state, {**self.meta, "epoch": epoch + 1, "step": run.step})
                ckpt = ray.train.Checkpoint.from_directory(tmp)
            run.reporter.report(metrics, run.step, checkpoint=ckpt)


class SweepStop(Hook):
    """A sweep's scheduler (ASHA) stopping this trial after an epoch (`reporting.stop_requested`)."""

    def __init__(self, decisions: str):
        self.decisions = decisions

    def on_train_epoch_end(self, run: WorkerRun, metrics: dict[str, Any]) -> None:
        if stop_requested(self.decisions, run.epoch + 1, run.rank, run.world, run.device):
            run.say(f"stopped early by the sweep's scheduler after epoch {run.epoch + 1}")
            run.stopped = True


def default_hooks(run: WorkerRun) -> list[Hook]:
    """The loop's hooks in calling order: a step may be interrupted before a drill kills a worker; an epoch's
    metrics are complete (memory, validation) before they are printed, reported and checkpointed, and the
    sweep decides on the reported epoch."""
    setup = run.setup
    hooks: list[Hook] = [Interruption(setup.stop, run.rank, run.world),
                         FaultDrill(run.cfg.train.fault_drill_epoch, setup.out_dir),
                         StepMetrics(run.cfg.train.log_every, run.model, captured=run.graph is not None)]
    if run.val_shard is not None:
        hooks.append(Validation(run.val_shard))
    hooks += [Console(), Report({"model": setup.identity, **setup.meta})]
    if setup.decisions:
        hooks.append(SweepStop(setup.decisions))
    return hooks
