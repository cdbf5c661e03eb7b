"""The learning-rate schedule of every training run: linear warm-up, then a cosine to `min_lr_ratio`, counted in
windows seen by all workers together (so a run resized from a checkpoint continues the same schedule)."""

from __future__ import annotations

import numpy as np


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
