"""One Ray Train worker's run of the loop: its device, the task's module sharded over the workers, the optimiser
and LR schedule, the state resumed from the newest checkpoint, and one training step. The loop (`loop.py`)
walks the epochs; what else happens around a step or an epoch is a hook's (`hooks.py`).

FSDP2 per unit of the task (DDP with train.fsdp=false), bf16 autocast where the device has it, `train.compile`
and `train.cuda_graphs` (the whole step captured as one CUDA graph, `step_graph.py`). Randomness: token selection
and dropout draw from one explicit torch Generator per worker, reseeded at every epoch from (seed, epoch, rank),
so a resumed run replays the same selections as an uninterrupted one.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from wxray.forecast import checkpoints
from wxray.models import latitude_weights
from wxray.models.compiled import compile_module
from wxray.platform.cluster import devices, memory
from wxray.platform.train.batches import dummy_like, epoch_batches, epoch_generator, lockstep_batches
from wxray.platform.train.reporting import Reporter
from wxray.platform.train.resume import is_sharded, newest_checkpoint, set_state
from wxray.platform.train.schedule import lr_factor, sample_schedule
from wxray.platform.train.step_graph import StepFn, StepGraph, capturable_adamw, match_capture, set_lr, why_not_captured
from wxray.platform.train.tasks import Task


@dataclass
class LoopSetup:
    """Everything a worker needs, the same for every task. `cfg` is the job's config: every training job's
    has `train` (LoopConfig), `optim`, `scaling` and `data.batch_size`."""

    cfg: Any
    task: Task
    identity: dict[str, Any]  # what a checkpoint must agree on to resume (model config, channels, ...)
    meta: dict[str, Any]  # the rest of every checkpoint's meta.json: data, normalisation, provenance
    n_train: int  # training windows per epoch (all workers together)
    has_val: bool
    example: dict[str, np.ndarray]  # one batch as the reader makes it: the shape of an exhausted worker's dummy
    out_dir: str
    tracking_uri: str = ""
    mlflow_run_id: str = ""
    progress: Any = None  # a ray.util.queue.Queue for the console lines (reporting.ProgressPrinter)
    decisions: str = ""  # a sweep's stop/continue folder (reporting.stop_requested)
    stop: Any = None  # interrupt.StopFlag: Ctrl-C on the driver (the loop stops at the next step)
    resume_from: str = ""  # the newest checkpoint the driver found in the run's storage ("" = none)


@dataclass
class StepOut:
    """What one training step gave: the weighted loss and auxiliary loss (detached), this worker's weight and
    samples, the LR it ran at."""

    loss: torch.Tensor
    aux: torch.Tensor | None
    w: float
    n: int
    lr: float


def prepare_module(setup: LoopSetup, device, world: int) -> torch.nn.Module:
    """The task's module on `device`, sharded (FSDP2 per unit) or replicated (DDP) over `world` workers."""
    from torch.distributed.fsdp import fully_shard

    cfg = setup.cfg
    torch.manual_seed(cfg.train.seed)  # identical initial weights on every rank
    model = setup.task.build().to(device)
    if world > 1 and cfg.train.fsdp:
        for unit in setup.task.shard_units(model):
            fully_shard(unit)
        fully_shard(model)
    elif world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    return model


def step_function(task: Task, model: torch.nn.Module, opt: torch.optim.Optimizer, lat_w: torch.Tensor, device,
                  dtype, grad_clip: float) -> StepFn:
    """One step after zero_grad: forward, backward, clip, optimizer step -> (weighted loss, auxiliary loss)."""

    def step(batch: dict, w, gen, meter: memory.SavedActivationMeter | None = None):
        with devices.compute(device, dtype), meter.measure() if meter else contextlib.nullcontext():
            loss, aux = task.loss(model, batch, lat_w, gen)
            loss = loss * w
        # added even at weight 0, so the head's parameters always get a gradient (DDP requires it)
        (loss if aux is None else loss + task.aux_weight * w * aux).backward()
        if grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        opt.step()
        return loss.detach(), None if aux is None else aux.detach()

    return step


class WorkerRun:
    """The state of one worker's run, shared with the hooks: `epoch`, `step` (optimiser steps taken), `seen`
    (windows seen by all workers), this epoch's `batch` index, `losses` and `samples`, `meter` (a hook's
    SavedActivationMeter for the next step, None: not measured), `last` (the latest StepOut) and `stopped`."""

    def __init__(self, setup: LoopSetup, rank: int, world: int, device: torch.device, shards: dict[str, Any]):
        cfg, task = setup.cfg, setup.task
        self.setup, self.cfg, self.task, self.rank, self.world, self.device = setup, cfg, task, rank, world, device
        self.train_shard, self.val_shard = shards["train"], shards.get("val")
        if device.type == "cpu":
            devices.set_cpu_threads(cfg.scaling.cpus_per_worker)
        model = prepare_module(setup, device, world)
        self.uncaptured = (why_not_captured(device, world, cfg.train.activation_checkpointing)
                           if cfg.train.cuda_graphs else "")
        params = [p for p in model.parameters() if p.requires_grad]
        adamw = dict(weight_decay=cfg.optim.weight_decay, betas=tuple(cfg.optim.betas))
        self.opt = (capturable_adamw(params, cfg.optim.lr, device, **adamw) if self.uncaptured is None
                    else torch.optim.AdamW(params, lr=cfg.optim.lr, **adamw))
        self.total_samples, self.warmup_samples, self.peak_lr = sample_schedule(cfg, setup.n_train, world)
        self.start_epoch, self.step, self.seen = 0, 0, 0
        self._resume(model, shards.get("checkpoint"))
        self.reporter = Reporter(rank, setup.tracking_uri, setup.mlflow_run_id, progress=setup.progress)
        self.module = model  # checkpoints hold its state: a compiled wrapper would prefix every key with _orig_mod.
        self.model = compile_module(model, cfg.train.compile, device, cfg.train.compile_backend, say=self.say)
        self.dtype = devices.autocast_dtype(cfg.train.precision, device)
        self.lat_w = latitude_weights(torch.as_tensor(task.spec.latitude, dtype=torch.float32)).to(device)  # kept
        self.dummy = dummy_like(setup.example, device)
        self.step_fn = step_function(task, self.model, self.opt, self.lat_w, device, self.dtype, cfg.optim.grad_clip)
        self.graph = StepGraph(self.step_fn, self.opt, device, say=self.say) if self.uncaptured is None else None
        if self.uncaptured:
            self.say(f"train.cuda_graphs: {self.uncaptured}")
        self.label = f"{task.label} " if task.label else ""
        self.epoch, self.batch, self.meter, self.last, self.stopped = 0, 0, None, None, False
        self.gen: torch.Generator | None = None
        self.losses: list[float] = []
        self.samples, self.t_epoch = 0, 0.0

    def _resume(self, model: torch.nn.Module, ray_checkpoint: Any) -> None:
        """Model, optimiser, RNG and counters of the newest checkpoint (Ray Train's or the driver's in storage)."""
        with newest_checkpoint(ray_checkpoint, self.setup.resume_from) as d:
            if d is None:
                return
            state, _ = checkpoints.load(d, expect_model=self.setup.identity)
            self.start_epoch = checkpoints.resume_epoch(state, d)
        set_state(model, self.opt, state["model"], state["optimizer"])
        match_capture(self.opt, self.uncaptured is None, self.device)
        torch.set_rng_state(state["torch_rng"])
        self.step, self.seen = int(state["step"]), int(state["samples_seen"])

    def say(self, line: str) -> None:
        """A console line from rank 0 (the others' would repeat it)."""
        if self.rank == 0:
            self.reporter.say(line)

    def begin_epoch(self, epoch: int) -> None:
        self.epoch, self.batch, self.samples, self.losses = epoch, 0, 0, []
        self.gen = epoch_generator(self.cfg.train.seed, epoch, self.rank)
        if self.graph is not None:  # the same seed, drawn on the device (step_graph.py)
            self.graph.reseed(self.gen.initial_seed())
        self.model.train()
        self.t_epoch = time.perf_counter()

    def batches(self) -> Iterator[tuple[dict, float, int]]:
        """This epoch's batches of this worker, in lockstep with the others (at most max_steps_per_epoch)."""
        cfg = self.cfg
        batches = epoch_batches(self.train_shard, cfg.data.batch_size, cfg.train.seed, self.device, self.epoch)
        for i, item in enumerate(lockstep_batches(batches, self.dummy, self.device, self.world)):
            if cfg.train.max_steps_per_epoch and i >= cfg.train.max_steps_per_epoch:
                return
            self.batch = i
            yield item

    def train_step(self, batch: dict, w: float, n_global: int) -> StepOut:
        """One optimiser step at the schedule's LR (a replay of the captured step where there is one)."""
        o = self.cfg.optim
        set_lr(self.opt, lr := self.peak_lr * lr_factor(self.seen, self.warmup_samples, self.total_samples,
                                                         o.min_lr_ratio))
        if self.graph is not None:  # a replay: the saved activations are those the capture measured
            loss, aux = self.graph(batch, w)
        else:
            self.opt.zero_grad(set_to_none=True)
            loss, aux = self.step_fn(batch, w, self.gen, self.meter)
        self.step, self.seen = self.step + 1, self.seen + n_global
        n = int(batch["x"].shape[0]) if w else 0
        self.samples += n
        if w:
            self.losses.append(loss.item() / w)
        self.last = StepOut(loss, aux, w, n, lr)
        return self.last

    def epoch_metrics(self) -> dict[str, Any]:
        """The epoch's own figures (`epoch` counts epochs completed, as the console does); hooks add theirs."""
        elapsed = time.perf_counter() - self.t_epoch
        return {"epoch": self.epoch + 1, "step": self.step, "train/world_size": self.world,
                "train/fsdp_sharded": float(is_sharded(self.model)),
                "train/epoch_loss": float(np.mean(self.losses)) if self.losses else float("nan"),
                "train/epoch_samples_per_s_per_worker": self.samples / max(elapsed, 1e-9)}
