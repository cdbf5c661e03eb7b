"""Work on model replicas held by Ray actors: any picklable work object (a `forecast.forecaster.BatchWriter`:
model, store and seeds; the nested ensemble's models and plans, `ensemble.actors`) is sent to `actors` actors
once, each moves it to its device, and the items (batches of (init, member) samples; ensemble units) are
handed out two at a time per actor and yielded back as they finish, in any order.

The forecast's work writes its own output where every actor can reach it (the one forecast.zarr, by region);
only a small result (the batch written) comes back, so the driver's memory does not grow with the output. Failures:
an actor that dies is restarted (`max_restarts`) and its in-flight items are retried; the items' draws derive
from their coordinates (`forecast/seeds.py`), so a recomputed item is bit-identical.

Resources: `num_cpus` / `num_gpus` per actor (whole or fractional), checked against the live nodes before any
actor is made, so a request no cluster can meet is an error, not a wait; `vendor=any` lets actors sit on
NVIDIA and AMD nodes at once (`placement.actor_options`), each on the device its node gives it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch

from wxray.errors import ConfigError, WxrayError
from wxray.forecast.workers import WorkersConfig
from wxray.platform.cluster.placement import actor_options, cluster_nodes, device_for_actor
from wxray.verify.blocks import ordered_ahead


def actor_capacity(nodes: Iterable[dict[str, float]], num_cpus: float, num_gpus: float) -> int:
    """How many actors of (num_cpus, num_gpus) the nodes' total resources hold at once."""
    total = 0
    for res in nodes:
        fits = [math.floor(res.get(key, 0.0) / need + 1e-9) for key, need in (("CPU", num_cpus), ("GPU", num_gpus))
                if need > 0]
        total += min(fits) if fits else 0
    return total


def check_fits(actors: int, num_cpus: float, num_gpus: float, vendor: str = "any") -> None:
    """ConfigError unless the live cluster (with vendor != any: that vendor's nodes) can hold `actors` actors of
    that size at once."""
    nodes = cluster_nodes()
    if vendor != "any":
        nodes = [n for n in nodes if n.vendor == vendor]
    room = actor_capacity([n.total for n in nodes], num_cpus, num_gpus)
    if room < actors:
        cpus = sum(n.total.get("CPU", 0.0) for n in nodes)
        gpus = sum(n.total.get("GPU", 0.0) for n in nodes)
        where = "the cluster" if vendor == "any" else f"the cluster's {vendor} nodes"
        raise ConfigError(f"actors={actors} of num_cpus={num_cpus:g}, num_gpus={num_gpus:g} each: {where} "
                          f"({len(nodes)} node(s), {cpus:g} CPU, {gpus:g} GPU) hold at most {room}; lower "
                          "actors or the per-actor resources")


def largest_node_memory() -> float | None:
    """Bytes of Ray's `memory` resource on the cluster's largest node (None: not connected)."""
    mem = [n.total.get("memory", 0.0) for n in cluster_nodes()]
    return max(mem) if mem and max(mem) > 0 else None


def actor_device(name: str) -> str:
    """`workers.device` inside an actor: auto is the actor's own GPU when Ray gave it one, else cpu."""
    return str(device_for_actor()) if name == "auto" else name


class _Replica:
    """One replica of the work; `run` does one item. The work comes with every call as a reference wrapped in
    a list (Ray does not fetch it each time) and is fetched on the first, so a restarted actor fetches it again
    on its retried call (ray-project/ray#53727: constructor arguments of a restarted actor)."""

    def __init__(self, device: str, threads: int):
        if threads > 0:
            torch.set_num_threads(threads)
        self.device = actor_device(device)
        self.work = None

    def run(self, work: list[Any], item: Any, *args: Any) -> Any:
        if self.work is None:
            import ray

            self.work = ray.get(work[0]).to(self.device)
        return self.work(item, *args)


class ReplicaRunner:
    """`runner(work, items)`: `work(item)` for each item on `workers.actors` replicas of `work` (its
    `.to(device)` gives the replica), yielded as they finish, in any order.

    `args(item)`, called as each item is handed out, gives extra arguments sent with it; object references
    among them are fetched on the actor (an ensemble init's inputs, put once for all its units).
    `on_started(handles)` is called once the actors exist (tests kill one). `what` ("a forecast actor")
    and `unit` ("batch(es)") word the error when an actor dies for good."""

    def __init__(self, workers: WorkersConfig, what: str = "a forecast actor", unit: str = "batch(es)"):
        self.workers, self.what, self.unit = workers, what, unit

    def __call__(self, work: Any, items: Sequence[Any], *, args: Callable[[Any], tuple] | None = None,
                 on_started: Callable[[list[Any]], None] | None = None) -> Iterator[Any]:
        import ray

        if not items:
            return
        w = self.workers
        actors = min(w.actors, len(items))
        check_fits(actors, w.num_cpus, w.num_gpus, w.vendor)
        ref = ray.put(work)
        threads = max(1, int(w.num_cpus)) if w.num_gpus == 0 else 0
        cls = ray.remote(_Replica).options(num_cpus=w.num_cpus, max_restarts=w.max_restarts,
                                           max_task_retries=w.max_restarts,
                                           **actor_options(w.num_gpus, w.vendor, key="workers.num_gpus"))
        handles = [cls.remote(w.device, threads) for _ in range(actors)]
        if on_started is not None:
            on_started(handles)
        queue, pending, finished = list(items), {}, 0

        def submit(k: int) -> None:
            item = queue.pop(0)
            pending[handles[k].run.remote([ref], item, *(args(item) if args else ()))] = k

        try:
            for k in range(actors):
                for _ in range(2):  # one in flight while the other runs: an actor never waits for the driver
                    if queue:
                        submit(k)
            while pending:
                [ready], _ = ray.wait(list(pending), num_returns=1)
                k = pending.pop(ready)
                try:
                    result = ray.get(ready)
                except ray.exceptions.RayActorError as e:
                    raise WxrayError(f"{self.what} died more than workers.max_restarts={w.max_restarts} "
                                     f"times ({type(e).__name__}); re-run into the same out_dir to continue from "
                                     f"the {finished} {self.unit} written") from None
                finished += 1
                yield result
                if queue:
                    submit(k)
        finally:
            for h in handles:
                ray.kill(h)


class TaskMap:
    """`map(fn, *iterables)` on Ray tasks across the cluster: results in order, at most 2 x `tasks` in flight
    (so the inputs in flight, not all of them, are in the object store; `verify.blocks.ordered_ahead`, as the
    worker processes' map). For work whose items are independent and small to describe (the scorecard's
    blocks: `verify.blocks`)."""

    def __init__(self, tasks: int, num_cpus: float = 1.0):
        self.tasks, self.num_cpus = tasks, num_cpus

    def __call__(self, fn: Any, *iterables: Iterable) -> Iterator[Any]:
        import ray

        remote = ray.remote(fn).options(num_cpus=self.num_cpus)
        yield from ordered_ahead(remote.remote, ray.get, iterables, 2 * self.tasks - 1, cancel=ray.cancel)
