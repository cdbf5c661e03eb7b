"""How a Train worker walks its shard: one epoch's locally shuffled batches, the workers kept in lockstep, and
the per-(seed, epoch, rank) generator every random draw of a training step comes from."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
import torch.distributed as dist


def epoch_generator(seed: int, epoch: int, rank: int) -> torch.Generator:
    """Token selection and dropout of one worker's epoch: reseeded every epoch, so a resumed run replays the
    draws of an uninterrupted one."""
    return torch.Generator().manual_seed(int(seed) * 1_000_003 + epoch * 1009 + rank)


def epoch_batches(shard, batch_size: int, seed: int, device, epoch: int):
    """One epoch of a worker's shard, locally shuffled with a seed of (seed, epoch)."""
    return shard.iter_torch_batches(batch_size=batch_size, device=device, local_shuffle_buffer_size=4 * batch_size,
                                    local_shuffle_seed=seed + epoch)


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


def dummy_like(example: dict, device) -> dict[str, torch.Tensor]:
    """A one-row, all-zero batch shaped like `example` (an exhausted worker's stand-in; every mask 0)."""
    return {k: torch.zeros((1, *v.shape[1:]), dtype=torch.as_tensor(v).dtype, device=device)
            for k, v in example.items()}
