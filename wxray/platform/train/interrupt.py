"""Ctrl-C during a training run: stop at the next step, keep the newest checkpoint, exit 130.

Ray Train's own SIGINT handler aborts the controller: the workers die mid-step, the driver exits 1 with
nothing said, the MLflow run ends FAILED, and a step or an epoch more may run meanwhile. Here instead
(`graceful_sigint`, around `TorchTrainer.fit` on the driver's main thread) the first Ctrl-C sets a flag in
the cluster's key-value store (the GCS, which every node reaches: no shared file system needed); rank 0
reads it between steps without waiting on it (`StopPoll`, at most every `POLL_S`), one all-reduce per step
gives every rank the same answer, and the loop leaves the epoch at the next step. The partial epoch is not
checkpointed (a checkpoint within an epoch would need each shard's data position): the run's newest
checkpoint is its last complete epoch, which the same command resumes from. `fit` returns normally and the
driver raises KeyboardInterrupt: the job's one line `error: interrupted: ...`, exit status 130, MLflow
KILLED. A second Ctrl-C aborts at once through Ray's own abort.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import ray
import torch
import torch.distributed as dist
from ray.experimental import internal_kv

from wxray.console import say

NAMESPACE = "wxray"
POLL_S = 0.5


class StopFlag:
    """A cluster-wide flag (picklable: workers get it in their LoopSetup)."""

    def __init__(self) -> None:
        self.key = f"stop:{uuid.uuid4().hex}"

    def set(self) -> None:
        internal_kv._internal_kv_put(self.key, b"1", overwrite=True, namespace=NAMESPACE)

    def is_set(self) -> bool:
        return internal_kv._internal_kv_initialized() and internal_kv._internal_kv_exists(self.key,
                                                                                           namespace=NAMESPACE)

    def clear(self) -> None:
        if internal_kv._internal_kv_initialized():
            internal_kv._internal_kv_del(self.key, namespace=NAMESPACE)


class StopPoll:
    """On a worker, called once per step: whether every rank stops now (the same answer on all of them)."""

    def __init__(self, flag: StopFlag | None, rank: int, world: int):
        self.flag, self.rank, self.world = flag, rank, world
        self._seen, self._last = False, 0.0
        self.stopped = False

    def __call__(self, device) -> bool:
        if self.flag is None:
            return False
        if self.rank == 0 and not self._seen and time.monotonic() - self._last >= POLL_S:
            self._last = time.monotonic()
            self._seen = self.flag.is_set()
        if self.world == 1:
            self.stopped = self._seen
        else:
            agreed = torch.tensor([float(self._seen)], device=device)
            dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
            self.stopped = bool(agreed.item())
        return self.stopped


class Interrupted:
    """What `graceful_sigint` saw: `stopped` once a Ctrl-C asked the run to stop."""

    stopped = False


@contextlib.contextmanager
def graceful_sigint(trainer: Any, flag: StopFlag) -> Iterator[Interrupted]:
    """Within: the first SIGINT sets `flag`, the second aborts the run (Ray's abort). Replaces the handler
    Ray Train registers in `fit` (only on the main thread; a Tune trial's thread registers none)."""
    seen = Interrupted()
    if threading.current_thread() is not threading.main_thread():
        yield seen
        return
    previous = signal.getsignal(signal.SIGINT)
    count = 0

    def register(controller) -> None:
        def handler(signum, frame):
            nonlocal count
            count += 1
            if count == 1:
                seen.stopped = True
                flag.set()
                say("interrupted: stopping at the next step (Ctrl-C again to abort at once)")
                return
            with contextlib.suppress(Exception):
                ray.get(controller.abort.remote(), timeout=30)
            raise KeyboardInterrupt

        signal.signal(signal.SIGINT, handler)

    trainer._register_sigint_handler = register  # Ray Train 2.60's hook (DataParallelTrainer)
    try:
        yield seen
    finally:
        signal.signal(signal.SIGINT, previous)
        flag.clear()
