"""Batch-ensemble cost: plain Ray actors (what jobs/ensemble.py uses) vs Ray Data map_batches on an actor pool vs
the same units in this process, batched vs one dropout member at a time; and the job's memory vs M x N.

    python benchmarks/bench_ensemble.py                      # the demo chain, 16 inits x M=4, N=4 (~5 min, 2 cores)
    python benchmarks/bench_ensemble.py --inits 32 --members 4 4 2 --actors 2 --json out.json
    python benchmarks/bench_ensemble.py --memory 2x2 4x4 8x8 --memory-inits 2000-03-30T00/2000-03-31T18

Both run the same work units (init t, encoder draw i -> N x R members, `inference.nested.run_unit`) on the same
number of replicas with the same CPUs, on the uplifted chain in `--checkpoint`, and deliver every unit's
members to the driver (where the job writes them by coordinate):
  actors     ensemble.actors.fan_out: each init's inputs read once by the driver, shared by its M units
             through the object store, two units in flight per actor, results taken as they finish
  ray_data   ray.data.from_items(units).map_batches(<callable class holding a replica>, batch_size=1,
             compute=ActorPoolStrategy(size=actors)): each row reads its own init's inputs inside the map,
             results streamed back with iter_rows()
  in_process the same units in the driver, no Ray (what the fan-out costs on top), on as many torch
             threads as there are replicas; each init's inputs read once
  one_by_one in_process with the N dropout members of a unit rolled out one at a time (N calls of one row
             each, the same work) instead of as one batch of N rows
Timings: wall seconds for all units, replicas created and the model shipped to them included (both ways
build them per run), after a warm-up run of each (imports, caches); units/s;
runs interleaved (actors, ray_data, in_process, one_by_one, actors, ...) so load drift hits all alike; the
median is kept.

--memory MxN ...: runs jobs/ensemble.py (R = 1) for each size with keep_members=true and =false, each in its
own process, and reports the job's peak resident memory (the driver: it writes the stores and scores them;
the actors' share is one unit's rows, printed as the payload a unit sends), the size of its output folder
and the payload per unit. With keep_members=false the driver holds and writes moments only, so its memory
and disk should stay flat as M x N grows.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np


def _setup(args):
    from wxray.config import load_config
    from wxray.forecast.nested import Plan
    from wxray.platform.ensemble.batch import EnsembleConfig, build_models

    m, n, r = args.members
    cfg = load_config(EnsembleConfig, [f"checkpoint={args.checkpoint}", f"members.M={m}", f"members.N={n}",
                                       f"members.R={r}", f"lead_steps={args.lead_steps}"])
    models, layout, anchors, data, _ = build_models(cfg)
    anchors = anchors[: args.inits]
    plan = Plan(m, n, r, args.lead_steps, 0, (), layout.plan.dropout, True)
    units = [(a, i) for a in range(len(anchors)) for i in range(m)]
    return models, plan, units, anchors, layout.init_times[: len(anchors)], data


def run_actors(models, plan, units, anchors, times, data, actors: int) -> float:
    from wxray.data.e2e_windows import E2EReader
    from wxray.forecast.workers import WorkersConfig
    from wxray.platform.ensemble.actors import fan_out

    reader = E2EReader(data.spec, data.obs)
    got = []
    t0 = time.perf_counter()
    fan_out(models, [plan], [(0, a, i) for a, i in units], times, lambda a: reader.inputs(anchors[[a]]),
            lambda r, a, i, u: got.append(u), workers=WorkersConfig(actors=actors, num_cpus=1, device="cpu"))
    assert len(got) == len(units)
    return time.perf_counter() - t0


class _Replica:
    def __init__(self, models_ref, plan, spec, obs, anchors, times):
        import ray
        import torch

        from wxray.data.e2e_windows import E2EReader

        torch.set_num_threads(1)
        self.models = ray.get(models_ref[0]).prepare(plan.dropout)
        self.plan, self.reader, self.anchors, self.times = plan, E2EReader(spec, obs), anchors, times

    def __call__(self, batch):
        from wxray.forecast.nested import run_unit

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


def run_in_process(models, plan, units, anchors, times, data, actors: int, one_by_one: bool = False) -> float:
    import torch

    from wxray.data.e2e_windows import E2EReader
    from wxray.forecast.nested import run_unit

    reader = E2EReader(data.spec, data.obs)
    local = copy.deepcopy(models).prepare(plan.dropout)  # prepare() switches modes in place
    single = replace(plan, members_n=1)
    threads = torch.get_num_threads()
    torch.set_num_threads(actors)
    cached: tuple[int, dict] | None = None
    got = 0
    t0 = time.perf_counter()
    try:
        for a, i in units:
            if cached is None or cached[0] != a:
                cached = (a, reader.inputs(anchors[[a]]))
            if one_by_one:
                got += sum(run_unit(local, cached[1], times[a], i, single)["fields"].shape[1]
                           for _ in range(plan.members_n))
            else:
                got += run_unit(local, cached[1], times[a], i, plan)["fields"].shape[1]
    finally:
        torch.set_num_threads(threads)
    assert got == len(units) * plan.members_n
    return time.perf_counter() - t0


def _folder_mib(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def memory_sweep(args) -> list[dict]:
    """jobs/ensemble.py per (size, keep_members) in its own process: peak RSS (os.wait4), output size."""
    rows = []
    for size in args.memory:
        m, n = (int(x) for x in size.split("x"))
        for keep in (True, False):
            with tempfile.TemporaryDirectory() as tmp:
                argv = [sys.executable, "jobs/ensemble.py", f"checkpoint={args.checkpoint}", f"members.M={m}",
                        f"members.N={n}", "members.R=1", f"lead_steps={args.lead_steps}", f"out_dir={tmp}/out",
                        f"keep_members={str(keep).lower()}", f"workers.actors={args.actors}", "plots=false",
                        f"tracking.uri=sqlite:///{tmp}/m.db"] + ([f"inits={args.memory_inits}"] if args.memory_inits
                                                                  else [])
                t0 = time.perf_counter()
                proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                out = proc.stdout.read()
                _, status, usage = os.wait4(proc.pid, 0)
                if status:
                    raise SystemExit(f"{' '.join(argv)} failed:\n{out[-2000:]}")
                result = json.loads([ln for ln in out.splitlines() if ln.startswith("RESULT ")][-1][7:])
                rows.append({"M": m, "N": n, "keep_members": keep, "inits": result["inits"],
                             "driver_peak_MiB": usage.ru_maxrss / 1024, "output_MiB": _folder_mib(Path(tmp) / "out"),
                             "wall_s": time.perf_counter() - t0})
                print(f"  M x N = {m} x {n:<3} keep_members={str(keep).lower():5s} driver peak "
                      f"{rows[-1]['driver_peak_MiB']:7.1f} MiB  output {rows[-1]['output_MiB']:7.1f} MiB  "
                      f"({rows[-1]['wall_s']:.0f} s)", flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", default="runs/train_e2e/e2e")
    p.add_argument("--inits", type=int, default=16)
    p.add_argument("--members", type=int, nargs=3, default=[4, 4, 1], metavar=("M", "N", "R"))
    p.add_argument("--lead-steps", type=int, default=4)
    p.add_argument("--actors", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--memory", nargs="*", default=[], metavar="MxN", help="the memory sweep instead (sizes)")
    p.add_argument("--memory-inits", default="", help="inits=start/end of the memory sweep's jobs")
    p.add_argument("--json", default="")
    args = p.parse_args()
    if args.memory:
        rows = memory_sweep(args)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=2))
        return

    from wxray.platform.cluster.session import ensure_ray

    ensure_ray()
    import ray.data

    ray.data.DataContext.get_current().enable_progress_bars = False
    setup = _setup(args)
    runs = {"actors": run_actors, "ray_data": run_ray_data, "in_process": run_in_process,
            "one_by_one": lambda *a, actors: run_in_process(*a, actors=actors, one_by_one=True)}
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
    members = int(np.prod(args.members))
    for name in runs:
        out[name]["members_per_s"] = out[name]["units_per_s"] * members / args.members[0]
    out["actors_over_ray_data"] = out["actors"]["units_per_s"] / out["ray_data"]["units_per_s"]
    out["actors_over_in_process"] = out["actors"]["units_per_s"] / out["in_process"]["units_per_s"]
    out["batched_over_one_by_one"] = out["in_process"]["units_per_s"] / out["one_by_one"]["units_per_s"]
    print(f"{n_units} units of {members // args.members[0]} members, {args.actors} replicas / threads")
    for name in runs:
        o = out[name]
        print(f"  {name:10s} {o['wall_s']:6.1f} s  {o['units_per_s']:5.2f} units/s  {o['members_per_s']:6.1f} "
              f"members/s  {o['all_s']}")
    print(f"  plain actors / Ray Data: {out['actors_over_ray_data']:.2f}x; plain actors / in-process: "
          f"{out['actors_over_in_process']:.2f}x; batched / one member at a time: "
          f"{out['batched_over_one_by_one']:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
