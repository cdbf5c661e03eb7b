"""One reporting function for the training loop: MLflow from rank 0, and Ray Train/Tune from every rank.

`Reporter.log` is cheap per-step logging (MLflow only). `Reporter.report` is the per-epoch report: it
is a barrier across workers (`ray.train.report`), carries the checkpoint, and is what a Ray Tune driver
sees; the same metrics go to MLflow so sweeps and single runs read alike. `Reporter.say` sends a progress
line to the driver's console through a `ray.util.queue.Queue` (`ProgressPrinter` prints it there), so
the console shows the job's own lines while Ray's worker logs stay out of it (unless --verbose).
"""

from __future__ import annotations

import math
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

STOP, CONTINUE = "STOP", "CONTINUE"  # a sweep scheduler's decision after an epoch (wxray/tune/stopping.py)


class Reporter:
    def __init__(self, rank: int, tracking_uri: str = "", run_id: str = "", use_ray: bool = True,
                 progress=None):
        self.rank = rank
        self.use_ray = use_ray
        self.progress = progress
        self._client = None
        self._run_id = run_id
        if rank == 0 and tracking_uri and run_id:
            import logging

            from mlflow.tracking import MlflowClient

            logging.getLogger("mlflow").setLevel(logging.WARNING)
            self._client = MlflowClient(tracking_uri=tracking_uri)

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self._client is None:
            return

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, step) for k, v in metrics.items()
                 if isinstance(v, (int, float)) and math.isfinite(float(v))]
        if batch:
            try:
                self._client.log_batch(self._run_id, metrics=batch)
            except Exception as e:  # a tracking hiccup (locked sqlite, server restart) must not kill training
                warnings.warn(f"MLflow logging failed at step {step}: {type(e).__name__}: {e}", stacklevel=2)

    def report(self, metrics: dict[str, Any], step: int, checkpoint=None) -> None:
        self.log(metrics, step)
        if self.use_ray:
            import ray.train

            ray.train.report(metrics, checkpoint=checkpoint)

    def say(self, line: str) -> None:
        if self.progress is not None:
            try:
                self.progress.put(line, timeout=10)
                return
            except Exception:  # the driver went away; the line still lands in the worker's log
                pass
        sys.__stdout__.write(line + "\n")  # not print(): Ray Train V2 tees print() into its logger
        sys.__stdout__.flush()


_QUEUES: dict[str, Any] = {}  # one queue actor per driver and Ray session: a run after the first reuses it


def _driver_queue():
    import ray
    from ray.util.queue import Queue

    key = ray.get_runtime_context().get_job_id() + "@" + ray.get_runtime_context().gcs_address
    if key not in _QUEUES:
        _QUEUES.clear()  # those of an earlier Ray session died with it
        _QUEUES[key] = Queue(actor_options={"num_cpus": 0})
    return _QUEUES[key]


class ProgressPrinter:
    """Driver side of `Reporter.say`: a queue actor (no CPU; the driver's, kept for its later runs, and gone
    with the driver) and a thread printing what arrives."""

    def __init__(self, prefix: str = "wxray: "):
        self.queue = _driver_queue()
        self.prefix = prefix
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _drain(self, timeout: float) -> bool:
        from ray.util.queue import Empty

        try:
            line = self.queue.get(timeout=timeout)
        except Empty:
            return False
        except Exception:  # the queue actor died with the cluster
            self._stop.set()
            return False
        print(self.prefix + line, flush=True)
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            self._drain(0.5)

    def __enter__(self) -> ProgressPrinter:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        while self._drain(0.1):  # lines still in flight when training ended
            pass



def stop_requested(folder: str, epochs: int, rank: int, world: int, device, timeout_s: float = 120.0) -> bool:
    """Whether the sweep's scheduler decided that this trial stops after `epochs` completed epochs.

    Rank 0 waits for the decision file `<folder>/<epochs>` (Tune handles a report asynchronously; none
    within `timeout_s` counts as continue) and every rank gets its answer, so all stop at the same epoch.
    """
    import torch

    stop = 0.0
    if rank == 0:
        path = Path(folder) / str(epochs)
        deadline = time.monotonic() + timeout_s
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        stop = float(path.exists() and path.read_text().strip() == STOP)
    if world > 1:
        import torch.distributed as dist

        flag = torch.tensor([stop], device=device)
        dist.all_reduce(flag)
        stop = flag.item()
    return stop > 0
