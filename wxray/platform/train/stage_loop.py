"""`train_fn_per_worker` of the end-to-end stages encoder, decoder and chain (the processor stage is the
forecaster's own loop, trainer_loop.py).

The loop is the forecaster's: FSDP2 per transformer block (DDP when fsdp=false), bf16 autocast, the LR
schedule on windows seen, exactly-once shards kept in lockstep, checkpoints every `checkpoint_every`
epochs carrying model, optimiser, schedule position and RNG state, resume from the newest one. Randomness
(dropout, when a later stage enables it) draws from one generator per (seed, epoch, rank).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from wxray.config import from_dict
from wxray.data.e2e_windows import E2EData
from wxray.models import latitude_weights
from wxray.models.blocks import Block
from wxray.platform.cluster import devices
from wxray.platform.train import checkpoints
from wxray.platform.train.loop import (
    _set_state,
    epoch_batches,
    epoch_generator,
    lockstep_batches,
    lr_factor,
    report_epoch,
    sample_schedule,
)
from wxray.platform.train.reporting import Reporter
from wxray.platform.train.stage_config import TrainE2EConfig
from wxray.platform.train.stages import build_stage_model, decode_stations, next_state, obs_of, stage_loss


def shard(model: torch.nn.Module) -> None:
    from torch.distributed.fsdp import fully_shard

    for m in model.modules():
        if isinstance(m, Block):
            fully_shard(m)
    fully_shard(model)


def load_initial(model: torch.nn.Module, cfg: TrainE2EConfig, init: dict[str, str]) -> None:
    """Chain: the encoder and processor stages' weights (checked against their identities on the driver)."""
    for part, path in init.items():
        state, _ = checkpoints.load(path)
        getattr(model, part).load_state_dict(state["model"])


class Stage:
    """What the loop needs of a stage: its module, its loss, its validation scores. The deterministic
    stages are this class; the stochastic finetunes (platform/stochastic.py) subclass it."""

    def build(self, cfg, data: E2EData, init: dict[str, str]) -> torch.nn.Module:
        model = build_stage_model(cfg, data)
        if init:
            load_initial(model, cfg, init)
        return model

    def loss(self, cfg, model, batch, data: E2EData, lat_w, generator=None) -> torch.Tensor:
        return stage_loss(cfg, model, batch, data, lat_w, generator=generator)

    def validate(self, cfg, model, batches, data: E2EData, lat_w, device, world, dtype, dummy) -> dict:
        return validate(cfg, model, batches, data, lat_w, device, world, dtype, dummy)


@torch.no_grad()
def validate(cfg: TrainE2EConfig, model, batches, data: E2EData, lat_w, device, world, dtype, dummy) -> dict:
    """Normalised loss and RMSE per channel in physical units: of the analysis (encoder), of the lead-1
    forecast (chain), or at the station reports (decoder)."""
    model.eval()
    spec = data.spec
    names = data.station_variables if cfg.stage == "decoder" else [c.name for c in spec.inputs]
    sums = torch.zeros(len(names) * 2 + 2, dtype=torch.float64, device=device)  # SE, count per channel; loss, n
    gen = torch.Generator().manual_seed(cfg.train.seed + 7919)
    for batch, w, _ in lockstep_batches(batches, dummy, device, world):
        w = float(w > 0)
        with devices.compute(device, dtype):
            loss = stage_loss(cfg, model, batch, data, lat_w, generator=gen)
            if cfg.stage == "decoder":
                pred, values, mask = decode_stations(model, batch, data)
                se = ((pred.float() - values) ** 2 * mask * station_std(data, device) ** 2).sum(dim=(0, 1))
                cnt = mask.sum(dim=(0, 1))
            else:
                if cfg.stage == "encoder":
                    z = model(obs_of(batch), batch["static"], generator=gen).float()
                    truth = batch["x"][:, :len(spec.inputs)]
                else:
                    z0, pred = model(batch, generator=gen)
                    z = next_state(spec, z0.float(), pred.float())
                    truth = next_state(spec, batch["x"][:, :len(spec.inputs)], batch["y"])
                err = spec.unpad((z - truth) * torch.as_tensor(spec.in_std, device=device)[None, :, None, None])
                se = (err ** 2 * lat_w[None, None, :, None]).mean(dim=(-2, -1)).sum(0)
                cnt = torch.full_like(se, float(z.shape[0]))
        sums[: len(names)] += w * se.double()
        sums[len(names): 2 * len(names)] += w * cnt.double()
        sums[-2] += w * loss.double() * batch["x"].shape[0]
        sums[-1] += w * batch["x"].shape[0]
    if world > 1:
        dist.all_reduce(sums)
    out = {"val/loss": sums[-2].item() / max(1.0, sums[-1].item()), "val/windows": sums[-1].item()}
    for i, name in enumerate(names):
        out[f"val/rmse/{name}"] = float(np.sqrt(sums[i].item() / max(1.0, sums[len(names) + i].item())))
    model.train()
    return out


def station_std(data: E2EData, device) -> torch.Tensor:
    s = next(s for s in data.obs.streams if s.name == data.station_stream)
    return torch.tensor([s.std[v] for v in data.station_variables], dtype=torch.float32, device=device)


def _dummy(loader_batch: dict[str, np.ndarray], device) -> dict[str, torch.Tensor]:
    """A one-row, all-zero batch shaped like a real one (an exhausted worker's stand-in; all masks 0)."""
    return {k: torch.zeros((1, *v.shape[1:]), dtype=torch.as_tensor(v).dtype, device=device)
            for k, v in loader_batch.items()}


def train_fn_per_worker(config: dict[str, Any]) -> None:
    import ray.train

    stage: Stage = config.get("stage") or Stage()
    cfg = from_dict(config.get("cfg_cls", TrainE2EConfig), config["cfg"])
    data: E2EData = config["data"]
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = devices.worker_device()
    if device.type == "cpu":
        devices.set_cpu_threads(cfg.scaling.cpus_per_worker)
    torch.manual_seed(cfg.train.seed)
    model = stage.build(cfg, data, config.get("init") or {}).to(device)
    if world > 1 and cfg.train.fsdp:
        shard(model)
    elif world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.optim.lr,
                            weight_decay=cfg.optim.weight_decay, betas=tuple(cfg.optim.betas))
    total, warmup, peak_lr = sample_schedule(cfg, config["n_train"], world)

    start_epoch, step, seen = 0, 0, 0
    resume = ray.train.get_checkpoint()
    if resume is not None:
        with resume.as_directory() as d:
            state, _ = checkpoints.load(d, expect_model=config["identity"])
            start_epoch = checkpoints.resume_epoch(state, d)
        _set_state(model, opt, state["model"], state["optimizer"])
        torch.set_rng_state(state["torch_rng"])
        step, seen = int(state["step"]), int(state["samples_seen"])

    dtype = devices.autocast_dtype(cfg.train.precision, device)
    lat_w = latitude_weights(torch.as_tensor(data.spec.latitude, dtype=torch.float32)).to(device)
    dummy = _dummy(config["example"], device)
    reporter = Reporter(rank, config.get("tracking_uri", ""), config.get("mlflow_run_id", ""),
                        progress=config.get("progress"))
    train_shard = ray.train.get_dataset_shard("train")
    val_shard = ray.train.get_dataset_shard("val") if config["has_val"] else None

    for epoch in range(start_epoch, cfg.train.epochs):
        gen = epoch_generator(cfg.train.seed, epoch, rank)
        model.train()
        t_epoch, n_samples, losses = time.perf_counter(), 0, []
        batches = epoch_batches(train_shard, cfg, device, epoch)
        for i, (batch, w, n_global) in enumerate(lockstep_batches(batches, dummy, device, world)):
            if cfg.train.max_steps_per_epoch and i >= cfg.train.max_steps_per_epoch:
                break
            t0 = time.perf_counter()
            with devices.compute(device, dtype):
                loss = stage.loss(cfg, model, batch, data, lat_w, generator=gen) * w
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.optim.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
            lr = peak_lr * lr_factor(seen, warmup, total, cfg.optim.min_lr_ratio)
            for group in opt.param_groups:
                group["lr"] = lr
            opt.step()
            step, seen = step + 1, seen + n_global
            n = int(batch["x"].shape[0]) if w else 0
            n_samples += n
            if w:
                losses.append(loss.item() / w)
            if step % cfg.train.log_every == 0:
                dt = time.perf_counter() - t0
                reporter.log({"train/loss": loss.item() / w if w else float("nan"), "train/lr": lr,
                              "train/step_time_s": dt, "train/samples_per_s_per_worker": n / dt}, step)
        elapsed = time.perf_counter() - t_epoch
        metrics = {"epoch": epoch + 1, "step": step, "train/world_size": world,
                   "train/epoch_loss": float(np.mean(losses)) if losses else float("nan"),
                   "train/epoch_samples_per_s_per_worker": n_samples / max(elapsed, 1e-9)}
        if val_shard is not None:
            metrics.update(stage.validate(cfg, model, val_shard.iter_torch_batches(
                batch_size=cfg.data.batch_size, device=device), data, lat_w, device, world, dtype, dummy))
        if rank == 0:
            val = f", val loss {metrics['val/loss']:.4f}" if "val/loss" in metrics else ""
            reporter.say(f"{config.get('label', cfg.stage)} epoch {epoch + 1}/{cfg.train.epochs}: step {step}, "
                         f"train loss {metrics['train/epoch_loss']:.4f}{val}")
        report_epoch(reporter, model, opt, metrics, rank, cfg, epoch, step, seen,
                     {"model": config["identity"], "data": {**config["cfg"]["data"], "store": data.spec.store},
                      checkpoints.NORMALISATION: checkpoints.normalisation_meta(data.spec),
                      checkpoints.PROVENANCE: config.get("provenance") or {}})
