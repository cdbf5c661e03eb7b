"""Batch-ensemble throughput: plain Ray actors (what jobs/ensemble.py uses) vs Ray Data map_batches on an actor pool.

    python benchmarks/bench_ensemble.py                      # the demo chain, 16 inits x M=4, N=4 (~3 min, 2 cores)
    python benchmarks/bench_ensemble.py --inits 32 --members 4 4 2 --actors 2 --json out.json

Both run the same work units (init t, encoder draw i -> N x R members, `ensemble_units.run_unit`) on the same
number of replicas with the same CPUs, on the uplifted chain in `--checkpoint`, and deliver every unit's
members to the driver (where the job writes them by coordinate):
  actors     ensemble_actors.fan_out: each init's inputs read once by the driver, shared by its M units
             through the object store, two units in flight per actor, results taken as they finish
  ray_data   ray.data.from_items(units).map_batches(<callable class holding a replica>, batch_size=1,
             compute=ActorPoolStrategy(size=actors)): each row reads its own init's inputs inside the map,
             results streamed back with iter_rows()
Timings: wall seconds for all units, replicas created and the model shipped to them included (both ways
build them per run), after a warm-up run of each (imports, caches); units/s;
runs interleaved (actors, ray_data, actors, ray_data, ...) so load drift hits both alike; the median is kept.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np


def _setup(args):
    from wxray.config import load_config
    from wxray.platform.ensemble import EnsembleConfig, build_models
    from wxray.platform.ensemble_units import Plan

    m, n, r = args.members
    cfg = load_config(EnsembleConfig, [f"checkpoint={args.checkpoint}", f"members.M={m}", f"members.N={n}",
                                       f"members.R={r}", f"lead_steps={args.lead_steps}"])
    models, layout, anchors, data, _ = build_models(cfg)
    anchors = anchors[: args.inits]
    plan = Plan(m, n, r, args.lead_steps, 0, (), layout.plan.dropout, True)
    units = [(a, i) for a in range(len(anchors)) for i in range(m)]
    return models, plan, units, anchors, layout.init_times[: len(anchors)], data


def run_actors(models, plan, units, anchors, times, data, actors: int) -> float:
    from wxray.platform.e2e_data import E2EReader
    from wxray.platform.ensemble_actors import fan_out

    reader = E2EReader(data.spec, data.obs)
    got = []
    t0 = time.perf_counter()
    fan_out(models, plan, units, times, lambda a: reader.inputs(anchors[[a]]), lambda a, i, u: got.append(u),
            actors=actors, num_cpus=1, num_gpus=0, device="cpu")
    assert len(got) == len(units)
    return time.perf_counter() - t0


class _Replica:
    def __init__(self, models_ref, plan, spec, obs, anchors, times):
        import ray
        import torch

        from wxray.platform.e2e_data import E2EReader

        torch.set_num_threads(1)
        self.models = ray.get(models_ref[0]).prepare(plan.dropout)
        self.plan, self.reader, self.anchors, self.times = plan, E2EReader(spec, obs), anchors, times

    def __call__(self, batch):
        from wxray.platform.ensemble_units import run_unit

        a, i = int(batch["a"][0]), int(batch["i"][0])
        unit = run_unit(self.models, self.reader.inputs(self.anchors[[a]]), self.times[a], i, self.plan)
        return {"a": np.array([a]), "i": np.array([i]), "fields": unit["fields"][None]}


def run_ray_data(models, plan, units, anchors, times, data, actors: int) -> float:
    import ray

    ref = ray.put(models)
    t0 = time.perf_counter()
    ds = ray.data.from_items([{"a": a, "i": i} for a, i in units], override_num_blocks=len(units))
    out = ds.map_batches(_Replica, batch_size=1, compute=ray.data.ActorPoolStrategy(size=actors), num_cpus=1,
                         fn_constructor_args=([ref], plan, data.spec, data.obs, anchors, times))
    n = sum(1 for _ in out.iter_rows())
    assert n == len(units)
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", default="runs/train_e2e/e2e")
    p.add_argument("--inits", type=int, default=16)
    p.add_argument("--members", type=int, nargs=3, default=[4, 4, 1], metavar=("M", "N", "R"))
    p.add_argument("--lead-steps", type=int, default=4)
    p.add_argument("--actors", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", default="")
    args = p.parse_args()

    from wxray.platform.accelerators import ensure_ray

    ensure_ray()
    import ray.data

    ray.data.DataContext.get_current().enable_progress_bars = False
    setup = _setup(args)
    runs = {"actors": run_actors, "ray_data": run_ray_data}
    times: dict[str, list[float]] = {k: [] for k in runs}
    for rep in range(args.repeats + 1):  # the first round warms both up and is not kept
        for name, fn in runs.items():
            t = fn(*setup, actors=args.actors)
            if rep:
                times[name].append(t)
    n_units = len(setup[2])
    out = {"units": n_units, "members": args.members, "lead_steps": args.lead_steps, "actors": args.actors,
           **{name: {"wall_s": statistics.median(v), "units_per_s": n_units / statistics.median(v),
                     "all_s": [round(x, 2) for x in v]} for name, v in times.items()}}
    out["actors_over_ray_data"] = out["actors"]["units_per_s"] / out["ray_data"]["units_per_s"]
    print(f"{n_units} units of {int(np.prod(args.members))} members, {args.actors} replicas")
    for name in runs:
        o = out[name]
        print(f"  {name:9s} {o['wall_s']:6.1f} s  {o['units_per_s']:5.2f} units/s  {o['all_s']}")
    print(f"  plain actors / Ray Data throughput: {out['actors_over_ray_data']:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
