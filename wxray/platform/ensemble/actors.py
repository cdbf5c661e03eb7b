"""Batch ensembles on Ray actors: one model replica per actor, work units (init t, encoder draw i) fanned out.

Plain actors, not Ray Data `map_batches` with an actor pool. Measured (`benchmarks/bench_ensemble.py`,
BENCHMARKS.md section 6): the same units on the same replicas run at the same speed either way (plain actors
1.04x on 2 CPUs), since a unit is one heavy call (an encoder pass and a rollout of N x R rows) and
scheduling costs nothing next to it. What decides it: every result must reach one writer that puts it in
place by coordinate and records it as done, an actor that dies must be restarted and only its units
retried, and each init's inputs should be read once for its M units. Plain actors with `ray.wait` do all
three directly; a unit's coordinates travel with it, so results are written in any order. Each actor has
at most two units in flight, so it never waits for the driver between units.

Several runs that differ only in the streams they deny (`jobs/ose.py`: a baseline and one run per stream)
share one fan-out: a unit is (run, init, draw), so the replicas are built once and each init's inputs are
read once for all the runs' units.

Failures: an actor that dies is restarted (`max_restarts`) and its in-flight units are retried
(`max_task_retries`). The restarted actor rebuilds its replica from the same object; the units' draws
derive from their coordinates (`forecast/seeds.py`), so recomputed members are bit-identical.

Resources: `num_cpus` / `num_gpus` (whole or fractional) per actor, checked against the live nodes before
any actor is created, so a request no cluster can meet is an error, not a wait. With `vendor=any` actors may
sit on NVIDIA and AMD nodes at once (`placement.actor_options`): a replica runs on whatever device its node
gives it (`placement.device_for_actor`); `nvidia` / `amd` pins them to one vendor's nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from wxray.errors import WxrayError
from wxray.forecast.nested import Plan, UnitModels, run_unit
from wxray.platform.cluster.placement import actor_options
from wxray.platform.cluster.replicas import actor_device, check_fits

Unit = tuple[int, int, int]  # (run, init index, encoder draw)


class _Worker:
    """One model replica; `run` computes one unit (the Ray actor class is made from this in `worker_class`).

    The replica comes with every call as a reference wrapped in a list (so Ray does not fetch it each time)
    and is fetched on the first: a restarted actor, whose constructor runs again, fetches it again on the
    retried call. (Passed to the constructor instead, a restart would depend on Ray keeping constructor
    arguments alive, ray-project/ray#53727.)
    """

    def __init__(self, plans: Sequence[Plan], device: str, threads: int):
        if threads > 0:
            torch.set_num_threads(threads)
        self.device = actor_device(device)
        self.plans = plans
        self.models: UnitModels | None = None

    def run(self, models: list[Any], run: int, a: int, init_time: np.datetime64, i: int,
            inputs: dict[str, np.ndarray]) -> tuple[int, int, int, dict[str, np.ndarray]]:
        if self.models is None:
            import ray

            self.models = ray.get(models[0]).to(self.device).prepare(self.plans[0].dropout)
        return run, a, i, run_unit(self.models, inputs, init_time, i, self.plans[run], self.device)


def worker_class():
    import ray

    return ray.remote(_Worker)


def fan_out(models: UnitModels, plans: Sequence[Plan], units: list[Unit], init_times: np.ndarray,
            read_inputs: Callable[[int], dict[str, np.ndarray]], write: Callable[[int, int, int, dict], None], *,
            actors: int, num_cpus: float, num_gpus: float, vendor: str = "any", device: str = "auto",
            max_restarts: int = 3,
            progress: Callable[[int], None] | None = None, on_started: Callable[[list[Any]], None] | None = None
            ) -> int:
    """Compute `units` (run, a, i) on `actors` replicas and `write(run, a, i, result)` each as it arrives;
    returns how many. Unit (run, a, i) follows `plans[run]`; the plans may differ only in what they deny.

    `read_inputs(a)` gives init a's inputs, read once and shared by all its units through the object store
    (so order the units init by init). `on_started(handles)` is called once the actors exist (tests kill one).
    """
    import ray

    if not units:
        return 0
    if len({replace(p, deny=()) for p in plans}) > 1:
        raise ValueError("fan_out: the runs' plans may differ only in their denied streams")
    actors = min(actors, len(units))
    check_fits(actors, num_cpus, num_gpus, vendor)
    ref = ray.put(models)
    threads = max(1, int(num_cpus)) if num_gpus == 0 else 0
    placement = actor_options(num_gpus, vendor, key="workers.num_gpus")  # any: NVIDIA and AMD nodes at once
    cls = worker_class().options(num_cpus=num_cpus, max_restarts=max_restarts, max_task_retries=max_restarts,
                                 **placement)
    handles = [cls.remote(list(plans), device, threads) for _ in range(actors)]
    if on_started is not None:
        on_started(handles)
    remaining = {}  # init index -> units of it not yet submitted
    for _, a, _ in units:
        remaining[a] = remaining.get(a, 0) + 1
    inputs: dict[int, Any] = {}
    queue = list(units)
    pending: dict[Any, int] = {}  # result ref -> actor index
    load = [0] * actors

    def submit(k: int) -> None:
        run, a, i = queue.pop(0)
        if a not in inputs:
            inputs[a] = ray.put(read_inputs(a))
        pending[handles[k].run.remote([ref], run, a, init_times[a], i, inputs[a])] = k
        load[k] += 1
        remaining[a] -= 1
        if not remaining[a]:
            inputs.pop(a)  # its units hold the reference now

    for k in range(actors):
        for _ in range(2):
            if queue:
                submit(k)
    done = 0
    try:
        while pending:
            [ready], _ = ray.wait(list(pending), num_returns=1)
            k = pending.pop(ready)
            load[k] -= 1
            try:
                run, a, i, result = ray.get(ready)
            except ray.exceptions.RayActorError as e:
                raise WxrayError(f"an ensemble actor died more than max_restarts={max_restarts} times "
                                 f"({type(e).__name__}); re-run into the same out_dir to continue from the "
                                 f"{done} unit(s) written") from None
            write(run, a, i, result)
            done += 1
            if progress is not None:
                progress(1)
            if queue:
                submit(k)
    finally:
        for h in handles:
            ray.kill(h)
    return done
