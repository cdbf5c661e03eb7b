"""A worker's state in and out of a checkpoint: the full (unsharded) model and optimiser state, gathered from or
scattered to FSDP2 shards, and the checkpoint to resume from (Ray Train's, or the driver's newest in storage)."""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import Any

import torch

from wxray.forecast import checkpoints


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
