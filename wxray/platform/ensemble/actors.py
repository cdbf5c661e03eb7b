"""Batch ensembles on Ray actors: one model replica per actor, work units (init t, encoder draw i) fanned out.

Plain actors, not Ray Data `map_batches` with an actor pool. Measured (`benchmarks/bench_ensemble.py`,
BENCHMARKS.md section 6): the same units on the same replicas run at the same speed either way (plain actors
1.04x on 2 CPUs), since a unit is one heavy call (an encoder pass and a rollout of N x R rows) and
scheduling costs nothing next to it. What decides it: every result must reach one writer that puts it in
place by coordinate and records it as done, an actor that dies must be restarted and only its units
retried, and each init's inputs should be read once for its M units. The actors, their resources, their
restarts and the two units in flight per actor are `platform/cluster/replicas.ReplicaRunner`'s (the forecast
job's batches run on the same runner); a unit's coordinates travel with it, so results are written in any
order.

Several runs that differ only in the streams they deny (`jobs/ose.py`: a baseline and one run per stream)
share one fan-out: a unit is (run, init, draw), so the replicas are built once and each init's inputs are
read once for all the runs' units. A restarted actor rebuilds its replica from the same object and its units
are retried; their draws derive from their coordinates (`forecast/seeds.py`), so recomputed members are
bit-identical.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from wxray.forecast.nested import Plan, UnitModels, run_unit
from wxray.forecast.workers import WorkersConfig
from wxray.platform.cluster.replicas import ReplicaRunner

Unit = tuple[int, int, int]  # (run, init index, encoder draw)


class _Units:
    """The work each actor holds (`replicas.ReplicaRunner`): the models and the runs' plans; called with a
    unit and its init's inputs, it computes that unit's members."""

    def __init__(self, models: UnitModels, plans: Sequence[Plan], init_times: np.ndarray):
        self.models, self.plans, self.init_times = models, list(plans), init_times
        self.device = "cpu"

    def to(self, device: str) -> _Units:
        self.models, self.device = self.models.to(device).prepare(self.plans[0].dropout), device
        return self

    def __call__(self, unit: Unit, inputs: dict[str, np.ndarray]) -> tuple[Unit, dict[str, np.ndarray]]:
        run, a, i = unit
        return unit, run_unit(self.models, inputs, self.init_times[a], i, self.plans[run], self.device)


def fan_out(models: UnitModels, plans: Sequence[Plan], units: list[Unit], init_times: np.ndarray,
            read_inputs: Callable[[int], dict[str, np.ndarray]], write: Callable[[int, int, int, dict], None], *,
            workers: WorkersConfig, progress: Callable[[int], None] | None = None,
            on_started: Callable[[list[Any]], None] | None = None) -> int:
    """Compute `units` (run, a, i) on `workers.actors` replicas and `write(run, a, i, result)` each as it
    arrives; returns how many. Unit (run, a, i) follows `plans[run]`; the plans may differ only in what they
    deny.

    `read_inputs(a)` gives init a's inputs, read once and shared by all its units through the object store
    (so order the units init by init). `on_started(handles)` is called once the actors exist (tests kill one).
    """
    import ray

    if not units:
        return 0
    if len({replace(p, deny=()) for p in plans}) > 1:
        raise ValueError("fan_out: the runs' plans may differ only in their denied streams")
    remaining: dict[int, int] = {}  # init index -> units of it not yet handed out
    for _, a, _ in units:
        remaining[a] = remaining.get(a, 0) + 1
    inputs: dict[int, Any] = {}

    def inputs_of(unit: Unit) -> tuple[Any]:
        a = unit[1]
        if a not in inputs:
            inputs[a] = ray.put(read_inputs(a))
        ref = inputs[a]
        remaining[a] -= 1
        if not remaining[a]:
            inputs.pop(a)  # its units hold the reference now
        return (ref,)

    runner = ReplicaRunner(workers, what="an ensemble actor", unit="unit(s)")
    done = 0
    for (run, a, i), result in runner(_Units(models, plans, init_times), units, args=inputs_of,
                                      on_started=on_started):
        write(run, a, i, result)
        done += 1
        if progress is not None:
            progress(1)
    return done
