"""`train_fn_per_worker`: the loop every Ray Train worker runs (FSDP2, bf16 autocast, checkpoints).

Randomness: token selection and dropout draw from one explicit torch Generator per worker, reseeded at
every epoch from (seed, epoch, rank), so a resumed run replays the same selections as an uninterrupted one.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from wxray.config import from_dict
from wxray.data.windows import WindowSpec, to_physical
from wxray.models import edm_loss, lat_weighted_mse, latitude_weights, selector_loss
from wxray.models.registry import ModelConfig, SamplerConfig, as_forecaster, build_forecaster
from wxray.platform.cluster import devices, memory
from wxray.platform.train import checkpoints
from wxray.platform.train.config import TrainSparseConfig
from wxray.platform.train.reporting import Reporter, stop_requested


def training_loss(model: torch.nn.Module, cfg: ModelConfig, spec: WindowSpec, batch: dict, lat_w: torch.Tensor,
                  var_w: torch.Tensor | None, generator) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(loss, auxiliary loss or None) of one batch: Eq. 3's latitude-weighted MSE of the forecast, or for a
    generative model Eq. 6's EDM loss at noise levels drawn from `generator`; both on the kept grid."""
    x, y = batch["x"], batch["y"]
    if cfg.generative:
        return edm_loss(model, y, x, lat_w, generator, cfg.p_mean, cfg.p_std, var_w, crop=spec.unpad), None
    pred = model(x, generator=generator).float()
    loss = lat_weighted_mse(spec.unpad(pred), spec.unpad(y), lat_w, var_w)
    # None unless selection=learned; on the model grid, padded rows weighted 0
    return loss, selector_loss(model, pred, y, spec.row_weights(lat_w))


def epoch_generator(seed: int, epoch: int, rank: int) -> torch.Generator:
    return torch.Generator().manual_seed(int(seed) * 1_000_003 + epoch * 1009 + rank)


def lockstep_batches(batches: Iterable[dict], dummy: dict, device: torch.device,
                     world: int) -> Iterator[tuple[dict, float, int]]:
    """Yield (batch, weight, global batch size) until every worker is out of data.

    Exactly-once sharding leaves shards unequal (Ray hands out whole blocks), but FSDP's collectives need
    every rank to step: an exhausted worker feeds a zero-weight dummy. weight = n_local * world / n_global,
    so the gradient that FSDP averages over ranks is the mean over the global batch, however it is split.
    """
    it = iter(batches)
    while True:
        batch = next(it, None)
        n = 0 if batch is None else int(batch["x"].shape[0])
        total = torch.tensor([float(n)], device=device)
        if world > 1:
            dist.all_reduce(total)
        n_global = int(total.item())
        if n_global == 0:
            return
        yield (dummy, 0.0, n_global) if batch is None else (batch, n * world / n_global, n_global)


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


def epoch_batches(shard, cfg, device, epoch: int):
    """One epoch of a worker's shard, locally shuffled with a seed of (seed, epoch)."""
    return shard.iter_torch_batches(batch_size=cfg.data.batch_size, device=device,
                                    local_shuffle_buffer_size=4 * cfg.data.batch_size,
                                    local_shuffle_seed=cfg.train.seed + epoch)


def report_epoch(reporter: Reporter, model, opt, metrics: dict, rank: int, cfg, epoch: int, step: int, seen: int,
                 meta: dict) -> None:
    """The per-epoch report, with a checkpoint (rank 0 writes it; every rank takes part in gathering the
    state) every `checkpoint_every` epochs and after the last."""
    import ray.train

    if (epoch + 1) % cfg.train.checkpoint_every and epoch != cfg.train.epochs - 1:
        reporter.report(metrics, step)
        return
    model_sd, opt_sd = _get_state(model, opt)
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = None
        if rank == 0:
            state = {"model": model_sd, "optimizer": opt_sd, "samples_seen": seen,
                     "next_epoch": epoch + 1, "step": step, "torch_rng": torch.get_rng_state()}
            checkpoints.save(tmp, state, {**meta, "epoch": epoch + 1, "step": step})
            ckpt = ray.train.Checkpoint.from_directory(tmp)
        reporter.report(metrics, step, checkpoint=ckpt)


def _shard(model: torch.nn.Module) -> None:
    from torch.distributed.fsdp import fully_shard

    for block in model.router.blocks:
        fully_shard(block)
    fully_shard(model)


def _is_sharded(model: torch.nn.Module) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def _state_options():
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def _get_state(model, opt) -> tuple[dict, dict]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    return get_state_dict(model, opt, options=_state_options())


def _set_state(model, opt, model_sd: dict, opt_sd: dict | None) -> None:
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    set_model_state_dict(model, model_sd, options=_state_options())
    if opt_sd is not None:
        set_optimizer_state_dict(model, opt, opt_sd, options=_state_options())


def validate(model, batches, spec: WindowSpec, lat_w: torch.Tensor, device, world: int, dtype,
             seed: int, dummy: dict, model_cfg: ModelConfig | None = None, sampler: SamplerConfig | None = None,
             final: bool = True) -> dict[str, float]:
    """Normalised loss and latitude-weighted RMSE per target channel in physical units.

    A generative model: the loss is the EDM loss (same noise levels every epoch); the RMSE, that of one
    sample per window drawn with `sampler`, costs 2 x sampler.steps - 1 forwards, so only the `final`
    validation computes it.
    """
    model_cfg, sampler = model_cfg or ModelConfig(), sampler or SamplerConfig()  # default: a deterministic model
    model.eval()
    forecaster = as_forecaster(model, model_cfg, sampler)
    score = final or not model_cfg.generative
    gen = torch.Generator().manual_seed(seed + 7919)  # validation draws the same tokens every epoch
    loss_gen = torch.Generator().manual_seed(seed + 7920)
    n_out = len(spec.targets)
    sums = torch.zeros(n_out + 2, dtype=torch.float64, device=device)  # per-channel SE, loss, count
    with torch.no_grad():
        for batch, w, _ in lockstep_batches(batches, dummy, device, world):
            w = float(w > 0)  # sums over real windows only
            x, y = batch["x"], batch["y"]
            with devices.compute(device, dtype):
                pred = forecaster(x, generator=gen).float() if score else None
                if model_cfg.generative:
                    loss = training_loss(model, model_cfg, spec, batch, lat_w, None, loss_gen)[0]
                else:
                    loss = lat_weighted_mse(spec.unpad(pred), spec.unpad(y), lat_w)
            if score:  # padded rows/columns (data.grid_fit=pad) are not data: scores and loss on the kept grid
                phys_p, phys_t = spec.unpad(to_physical(spec, pred, x)), spec.unpad(to_physical(spec, y, x))
                se = ((phys_p - phys_t) ** 2 * lat_w[None, None, :, None]).mean(dim=(-2, -1))  # (b, V)
                sums[:n_out] += w * se.sum(0).double()
            sums[n_out] += w * loss.double() * x.shape[0]
            sums[n_out + 1] += w * x.shape[0]
    if world > 1:
        dist.all_reduce(sums)
    count = max(1.0, sums[-1].item())
    out = {"val/loss": sums[n_out].item() / count, "val/windows": count}
    for i, ch in enumerate(spec.targets):
        if score:
            out[f"val/rmse/{ch.name}"] = float(np.sqrt(sums[i].item() / count))
    model.train()
    return out


def _fault_drill(cfg: TrainSparseConfig, epoch: int, rank: int, world: int, marker: Path) -> None:
    if cfg.train.fault_drill_epoch == epoch and rank == min(1, world - 1) and not marker.exists():
        marker.write_text(f"killed rank {rank} at the start of epoch {epoch}\n")
        os._exit(1)  # an abrupt death, as when a node is lost


def train_fn_per_worker(config: dict[str, Any]) -> None:
    import ray.train

    cfg = from_dict(TrainSparseConfig, config["cfg"])
    spec: WindowSpec = config["spec"]
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = devices.worker_device()
    if device.type == "cpu":
        devices.set_cpu_threads(cfg.scaling.cpus_per_worker)
    torch.manual_seed(cfg.train.seed)  # identical initial weights on every rank
    model = build_forecaster(cfg.model, spec).to(device)
    model.activation_checkpointing = cfg.train.activation_checkpointing
    if world > 1 and cfg.train.fsdp:
        _shard(model)
    elif world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay,
                            betas=tuple(cfg.optim.betas))
    total_samples, warmup_samples, peak_lr = sample_schedule(cfg, config["n_train"], world)

    def set_lr(seen: int) -> float:
        lr = peak_lr * lr_factor(seen, warmup_samples, total_samples, cfg.optim.min_lr_ratio)
        for group in opt.param_groups:
            group["lr"] = lr
        return lr

    start_epoch, step, seen = 0, 0, 0
    resume = ray.train.get_checkpoint()
    if resume is not None:
        with resume.as_directory() as d:
            state, _ = checkpoints.load(d, expect_model=config["model_identity"])
        _set_state(model, opt, state["model"], state["optimizer"])
        torch.set_rng_state(state["torch_rng"])
        start_epoch, step, seen = checkpoints.resume_epoch(state, d), int(state["step"]), int(state["samples_seen"])
    elif cfg.train.init_from:
        state, _ = checkpoints.load(cfg.train.init_from)
        _set_state(model, opt, state["model"], None)
    if cfg.train.compile:
        model = torch.compile(model)

    dtype = devices.autocast_dtype(cfg.train.precision, device)
    lat_w = latitude_weights(torch.as_tensor(spec.latitude, dtype=torch.float32)).to(device)  # kept rows
    var_w = torch.tensor([cfg.train.var_weights.get(c.name, 1.0) for c in spec.targets], device=device)
    dummy = {"x": torch.zeros(1, spec.n_in_channels, *spec.grid, device=device),
             "y": torch.zeros(1, len(spec.targets), *spec.grid, device=device)}
    reporter = Reporter(rank, config.get("tracking_uri", ""), config.get("mlflow_run_id", ""),
                        progress=config.get("progress"))
    meter_exclude = memory.SavedActivationMeter.parameter_pointers(model)
    train_shard = ray.train.get_dataset_shard("train")
    val_shard = ray.train.get_dataset_shard("val") if config["has_val"] else None
    marker = Path(config["out_dir"]) / ".fault_drill_done"

    for epoch in range(start_epoch, cfg.train.epochs):
        gen = epoch_generator(cfg.train.seed, epoch, rank)
        model.train()
        memory.reset_peak_memory(device)
        t_epoch, n_samples, losses, act_bytes = time.perf_counter(), 0, [], 0
        batches = epoch_batches(train_shard, cfg, device, epoch)
        for i, (batch, w, n_global) in enumerate(lockstep_batches(batches, dummy, device, world)):
            if cfg.train.max_steps_per_epoch and i >= cfg.train.max_steps_per_epoch:
                break
            if i == 1:
                _fault_drill(cfg, epoch, rank, world, marker)
            t0 = time.perf_counter()
            measure = step % cfg.train.log_every == 0
            meter = memory.SavedActivationMeter(meter_exclude)
            with devices.compute(device, dtype), (meter.measure() if measure else contextlib.nullcontext()):
                loss, aux = training_loss(model, cfg.model, spec, batch, lat_w, var_w, gen)
                loss = loss * w
            opt.zero_grad(set_to_none=True)
            # added even at weight 0, so the head's parameters always get a gradient (DDP requires it)
            (loss if aux is None else loss + cfg.model.selector_loss_weight * w * aux).backward()
            if cfg.optim.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
            lr = set_lr(seen)
            opt.step()
            step += 1
            seen += n_global
            n = int(batch["x"].shape[0]) if w else 0
            n_samples += n
            if w:
                losses.append(loss.item() / w)
            if measure:
                dt = time.perf_counter() - t0
                m = {"train/loss": loss.item() / w if w else float("nan"),
                     **({"train/selector_loss": aux.item()} if aux is not None and w else {}),
                     "train/lr": lr, "train/step_time_s": dt,
                     "train/samples_per_s_per_worker": n / dt, "train/saved_activation_bytes": meter.bytes}
                act_bytes = max(act_bytes, meter.bytes)
                peak = memory.peak_memory_bytes(device)
                if peak is not None:
                    m["train/peak_memory_bytes"] = peak
                reporter.log(m, step)
        elapsed = time.perf_counter() - t_epoch
        metrics = {"epoch": epoch + 1, "step": step, "train/world_size": world,  # epochs completed, as printed
                   "train/fsdp_sharded": float(_is_sharded(model)),
                   "train/epoch_loss": float(np.mean(losses)) if losses else float("nan"),
                   "train/epoch_samples_per_s_per_worker": n_samples / max(elapsed, 1e-9),
                   "train/epoch_saved_activation_bytes": act_bytes}  # the largest measured this epoch
        peak = memory.peak_memory_bytes(device)
        if peak is not None:
            metrics["train/epoch_peak_memory_bytes"] = peak
        if val_shard is not None:
            metrics.update(validate(model, val_shard.iter_torch_batches(batch_size=cfg.data.batch_size,
                                                                        device=device),
                                    spec, lat_w, device, world, dtype, cfg.train.seed, dummy, cfg.model,
                                    cfg.sampler, final=epoch == cfg.train.epochs - 1))
        if rank == 0:
            val = f", val loss {metrics['val/loss']:.4f}" if "val/loss" in metrics else ""
            reporter.say(f"epoch {epoch + 1}/{cfg.train.epochs}: step {step}, "
                         f"train loss {metrics['train/epoch_loss']:.4f}{val}, "
                         f"{metrics['train/epoch_samples_per_s_per_worker']:.1f} samples/s/worker")
        report_epoch(reporter, model, opt, metrics, rank, cfg, epoch, step, seen,
                     {"model": config["model_identity"], "data": {**config["cfg"]["data"], "store": spec.store},
                      checkpoints.NORMALISATION: checkpoints.normalisation_meta(spec),
                      checkpoints.PROVENANCE: config.get("provenance") or {}})
        if config.get("decisions") and stop_requested(config["decisions"], epoch + 1, rank, world, device):
            if rank == 0:
                reporter.say(f"stopped early by the sweep's scheduler after epoch {epoch + 1}")
            break
