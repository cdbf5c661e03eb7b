"""`train_fn_per_worker`: the one loop every Ray Train worker runs, whatever it trains (a `tasks.Task`).

FSDP2 per transformer block (DDP with train.fsdp=false), bf16 autocast where the device has it, the LR
schedule counted in windows seen (an elastic run keeps it across sizes), exactly-once shards kept in
lockstep, a checkpoint every `checkpoint_every` epochs carrying model, optimiser, schedule position and RNG
state, resume from the newest, `train.compile`, per-step memory metrics, the fault drill, a sweep's early
stop after any epoch, and Ctrl-C on the driver as a stop at the next step (`interrupt`). The driver hands
every worker one `LoopSetup` (TorchTrainer's `train_loop_config={"setup": ...}`, built by
`trainer.make_trainer`).

Randomness: token selection and dropout draw from one explicit torch Generator per worker, reseeded at
every epoch from (seed, epoch, rank), so a resumed run replays the same selections as an uninterrupted one.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from wxray.models import latitude_weights
from wxray.models.compiled import compile_module
from wxray.platform.cluster import devices, memory
from wxray.platform.train import checkpoints
from wxray.platform.train.batches import dummy_like, epoch_batches, epoch_generator, lockstep_batches
from wxray.platform.train.interrupt import StopPoll
from wxray.platform.train.reporting import Reporter, stop_requested
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


def lr_factor(step: int, warmup: int, total: int, min_ratio: float) -> float:
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return float(min_ratio + (1 - min_ratio) * 0.5 * (1 + np.cos(np.pi * progress)))  # plain float: weights_only


def sample_schedule(cfg, n_train: int, world: int) -> tuple[int, int, float]:
    """(total, warmup, peak LR) of the LR schedule, counted in windows seen by all workers together.

    On windows, not steps: shard sizes, and so step counts, vary with Ray's block assignment, the number of
    windows per epoch does not. Step counts in the config (warmup_steps, max_steps_per_epoch) convert to
    windows at the configured world size (an elastic run's maximum), so a run resized from a checkpoint
    keeps the same schedule and continues it at the windows it had seen. The peak LR follows the global batch
    of the workers running now (the paper: 5e-4 x accelerators^0.8). `cfg` has `train`, `optim` and
    `data.batch_size` (every training job's config), and `scaling` when it trains on Ray.
    """
    nominal = cfg.scaling.max_workers if hasattr(cfg, "scaling") else world
    per_epoch = n_train
    if cfg.train.max_steps_per_epoch:
        per_epoch = min(per_epoch, cfg.train.max_steps_per_epoch * nominal * cfg.data.batch_size)
    total = cfg.train.epochs * max(1, per_epoch)
    warmup = (round(cfg.optim.warmup_epochs * max(1, per_epoch)) if cfg.optim.warmup_epochs
              else cfg.optim.warmup_steps * nominal * cfg.data.batch_size)
    return total, warmup, cfg.optim.lr * world ** cfg.optim.lr_scaling


# torch.distributed.checkpoint and FSDP load only where a worker uses them (a job's --help and its input checks
# stay fast): the same below for ray.train.
def _state_options():
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def get_state(model, opt) -> tuple[dict, dict]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    return get_state_dict(model, opt, options=_state_options())


def set_state(model, opt, model_sd: dict, opt_sd: dict | None) -> None:
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    set_model_state_dict(model, model_sd, options=_state_options())
    if opt_sd is not None:
        set_optimizer_state_dict(model, opt, opt_sd, options=_state_options())


def is_sharded(model: torch.nn.Module) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def report_epoch(reporter: Reporter, model, opt, metrics: dict, rank: int, cfg, epoch: int, step: int, seen: int,
                 meta: dict) -> None:
    """The per-epoch report, with a checkpoint (rank 0 writes it; every rank takes part in gathering the
    state) every `checkpoint_every` epochs and after the last."""
    import ray.train

    if (epoch + 1) % cfg.train.checkpoint_every and epoch != cfg.train.epochs - 1:
        reporter.report(metrics, step)
        return
    model_sd, opt_sd = get_state(model, opt)
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = None
        if rank == 0:
            state = {"model": model_sd, "optimizer": opt_sd, "samples_seen": seen,
                     "next_epoch": epoch + 1, "step": step, "torch_rng": torch.get_rng_state()}
            checkpoints.save(tmp, state, {**meta, "epoch": epoch + 1, "step": step})
            ckpt = ray.train.Checkpoint.from_directory(tmp)
        reporter.report(metrics, step, checkpoint=ckpt)


@contextlib.contextmanager
def _private_copy(ray_checkpoint: Any):
    """A Ray Train checkpoint as a local folder of this process alone. Ray's as_directory() gives a node's
    workers one shared /tmp folder, which the first to finish deletes: a worker arriving late in a restart
    then found it empty (no meta.json; seen in CI with two workers on one node)."""
    if ray_checkpoint is None:
        yield None
    elif ray_checkpoint.filesystem.type_name == "local":
        yield ray_checkpoint.path
    else:
        with tempfile.TemporaryDirectory(prefix="wxray-resume-") as tmp:
            yield ray_checkpoint.to_directory(tmp)


@contextlib.contextmanager
def newest_checkpoint(ray_checkpoint: Any, on_disk: str):
    """The directory to resume from: Ray Train's checkpoint, or the driver's newest in storage when that has
    the later step. After a hard abort (a second Ctrl-C, a killed driver) Ray's checkpoint manager may not
    have recorded the last checkpoints it wrote; resuming from its older one would retrain epochs."""
    with _private_copy(ray_checkpoint) as d:
        found = [Path(d)] if d else []
        with contextlib.suppress(Exception):  # a path of the driver's node that this node cannot see
            local = Path(checkpoints.fetch(on_disk)) if on_disk else None
            if local is not None and (local / checkpoints.META).is_file():
                found.append(local)
        yield max(found, key=lambda c: int(checkpoints.read_meta(c).get("step", -1))) if found else None


def _fault_drill(cfg, epoch: int, rank: int, world: int, marker: Path) -> None:
    if cfg.train.fault_drill_epoch == epoch and rank == min(1, world - 1) and not marker.exists():
        marker.write_text(f"killed rank {rank} at the start of epoch {epoch}\n")
        os._exit(1)  # an abrupt death, as when a node is lost


def _prepare(setup: LoopSetup, device, world: int) -> torch.nn.Module:
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


def _step_fn(task: Task, model: torch.nn.Module, opt: torch.optim.Optimizer, lat_w: torch.Tensor, device,
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


def train_fn_per_worker(config: dict[str, Any]) -> None:
    import ray.train

    setup: LoopSetup = config["setup"]
    cfg, task = setup.cfg, setup.task
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = devices.worker_device()
    if device.type == "cpu":
        devices.set_cpu_threads(cfg.scaling.cpus_per_worker)
    model = _prepare(setup, device, world)
    uncaptured = why_not_captured(device, world, cfg.train.activation_checkpointing) if cfg.train.cuda_graphs else ""
    params = [p for p in model.parameters() if p.requires_grad]
    adamw = dict(weight_decay=cfg.optim.weight_decay, betas=tuple(cfg.optim.betas))
    if uncaptured is None:
        opt = capturable_adamw(params, cfg.optim.lr, device, **adamw)
    else:
        opt = torch.optim.AdamW(params, lr=cfg.optim.lr, **adamw)
    total_samples, warmup_samples, peak_lr = sample_schedule(cfg, setup.n_train, world)

    start_epoch, step, seen = 0, 0, 0
    with newest_checkpoint(ray.train.get_checkpoint(), setup.resume_from) as d:
        if d is not None:
            state, _ = checkpoints.load(d, expect_model=setup.identity)
            start_epoch = checkpoints.resume_epoch(state, d)
    if d is not None:
        set_state(model, opt, state["model"], state["optimizer"])
        match_capture(opt, uncaptured is None, device)
        torch.set_rng_state(state["torch_rng"])
        step, seen = int(state["step"]), int(state["samples_seen"])
    reporter = Reporter(rank, setup.tracking_uri, setup.mlflow_run_id, progress=setup.progress)
    say = reporter.say if rank == 0 else (lambda line: None)
    module = model  # checkpoints hold its state: a compiled wrapper would prefix every key with _orig_mod.
    model = compile_module(model, cfg.train.compile, device, cfg.train.compile_backend, say=say)

    dtype = devices.autocast_dtype(cfg.train.precision, device)
    lat_w = latitude_weights(torch.as_tensor(task.spec.latitude, dtype=torch.float32)).to(device)  # kept rows
    dummy = dummy_like(setup.example, device)
    step_fn = _step_fn(task, model, opt, lat_w, device, dtype, cfg.optim.grad_clip)
    graph = StepGraph(step_fn, opt, device, say=say) if uncaptured is None else None
    if uncaptured:
        say(f"train.cuda_graphs: {uncaptured}")
    meter_exclude = memory.SavedActivationMeter.parameter_pointers(model)
    train_shard = ray.train.get_dataset_shard("train")
    val_shard = ray.train.get_dataset_shard("val") if setup.has_val else None
    marker = Path(setup.out_dir) / ".fault_drill_done"
    batch_size, label = cfg.data.batch_size, f"{task.label} " if task.label else ""
    interrupted = StopPoll(setup.stop, rank, world)

    for epoch in range(start_epoch, cfg.train.epochs):
        gen = epoch_generator(cfg.train.seed, epoch, rank)
        if graph is not None:  # the same seed, drawn on the device (step_graph.py)
            graph.reseed(gen.initial_seed())
        model.train()
        memory.reset_peak_memory(device)
        t_epoch, n_samples, losses, act_bytes = time.perf_counter(), 0, [], 0
        batches = epoch_batches(train_shard, batch_size, cfg.train.seed, device, epoch)
        for i, (batch, w, n_global) in enumerate(lockstep_batches(batches, dummy, device, world)):
            if cfg.train.max_steps_per_epoch and i >= cfg.train.max_steps_per_epoch:
                break
            if interrupted(device):
                break
            if i == 1:
                _fault_drill(cfg, epoch, rank, world, marker)
            t0 = time.perf_counter()
            measure = step % cfg.train.log_every == 0
            meter = memory.SavedActivationMeter(meter_exclude)
            set_lr(opt, lr := peak_lr * lr_factor(seen, warmup_samples, total_samples, cfg.optim.min_lr_ratio))
            if graph is not None:  # a replay: the saved activations are those the capture measured
                loss, aux = graph(batch, w)
            else:
                opt.zero_grad(set_to_none=True)
                loss, aux = step_fn(batch, w, gen, meter if measure else None)
            step, seen = step + 1, seen + n_global
            n = int(batch["x"].shape[0]) if w else 0
            n_samples += n
            if w:
                losses.append(loss.item() / w)
            if measure:
                dt = time.perf_counter() - t0
                m = {"train/loss": loss.item() / w if w else float("nan"),
                     **({"train/selector_loss": aux.item()} if aux is not None and w else {}),
                     "train/lr": lr, "train/step_time_s": dt,
                     "train/samples_per_s_per_worker": n / dt,
                     **({} if graph else {"train/saved_activation_bytes": meter.bytes})}  # a replay saves none
                act_bytes = max(act_bytes, meter.bytes)
                peak = memory.peak_memory_bytes(device)
                if peak is not None:
                    m["train/peak_memory_bytes"] = peak
                reporter.log(m, step)
        if interrupted.stopped:  # this epoch is not complete: no checkpoint of it (see interrupt.py)
            if rank == 0:
                reporter.say(f"{label}stopped in epoch {epoch + 1} at step {step}: the newest checkpoint is "
                             f"{'after epoch ' + str(epoch) if epoch else 'none'}")
            break
        elapsed = time.perf_counter() - t_epoch
        metrics = {"epoch": epoch + 1, "step": step, "train/world_size": world,  # epochs completed, as printed
                   "train/fsdp_sharded": float(is_sharded(model)),
                   "train/epoch_loss": float(np.mean(losses)) if losses else float("nan"),
                   "train/epoch_samples_per_s_per_worker": n_samples / max(elapsed, 1e-9),
                   **({} if graph else {"train/epoch_saved_activation_bytes": act_bytes})}  # largest this epoch
        peak = memory.peak_memory_bytes(device)
        if peak is not None:
            metrics["train/epoch_peak_memory_bytes"] = peak
        if val_shard is not None:
            metrics.update(task.validate(model, val_shard.iter_torch_batches(batch_size=batch_size, device=device),
                                         lat_w, device, world, dtype, dummy, final=epoch == cfg.train.epochs - 1))
        if rank == 0:
            val = f", val loss {metrics['val/loss']:.4f}" if "val/loss" in metrics else ""
            reporter.say(f"{label}epoch {epoch + 1}/{cfg.train.epochs}: step {step}, "
                         f"train loss {metrics['train/epoch_loss']:.4f}{val}, "
                         f"{metrics['train/epoch_samples_per_s_per_worker']:.1f} samples/s/worker")
        report_epoch(reporter, module, opt, metrics, rank, cfg, epoch, step, seen,
                     {"model": setup.identity, **setup.meta})
        if setup.decisions and stop_requested(setup.decisions, epoch + 1, rank, world, device):
            if rank == 0:
                reporter.say(f"stopped early by the sweep's scheduler after epoch {epoch + 1}")
            break
