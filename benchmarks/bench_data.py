"""Samples/s of the Ray Data window pipeline against a plain single-process loop reading the same windows.

    python benchmarks/bench_data.py [--store data/sample_32x64.zarr] [--cpus 2] [--repeats 3] [--json out.json]
    python benchmarks/bench_data.py --obs data/sample_obs     # end-to-end windows: state + every obs stream

Both paths read, stack and normalise identical windows with `WindowReader` (with `--obs`: `E2EReader`, the
state plus every observation stream of the assimilation window); the Ray path runs the reads
in parallel `map_batches` tasks and consumes them with `iter_batches`, as a Train worker does. Ratios
come from one run on one machine; absolute numbers depend on disk cache and core count.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from wxray.data.window_data import DataConfig, prepare_windows
from wxray.data.windows import WindowReader
from wxray.platform.train.datasets import window_dataset


def plain_loop(reader, anchors, batch: int) -> float:
    t0 = time.perf_counter()
    n = 0
    for i in range(0, len(anchors), batch):
        out = reader({"anchor": anchors[i: i + batch]})
        n += out["x"].shape[0]
    return n / (time.perf_counter() - t0)


def ray_pipeline(make_dataset, anchors, read_batch: int, batch: int, read_cpus: float) -> float:
    ds = make_dataset(anchors, read_batch_size=read_batch, read_cpus=read_cpus)
    t0 = time.perf_counter()
    n = 0
    for out in ds.iter_batches(batch_size=batch, batch_format="numpy"):
        n += out["x"].shape[0]
    return n / (time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--store", default="data/sample_32x64.zarr")
    p.add_argument("--cpus", type=int, default=os.cpu_count() or 2)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--read-batch", type=int, default=32)
    p.add_argument("--passes", type=int, default=4, help="read the window list this many times per path")
    p.add_argument("--history", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", default="")
    p.add_argument("--obs", default="", help="an obs dir: benchmark end-to-end windows (history 1)")
    args = p.parse_args()

    import ray
    import ray.data

    if args.obs:
        from wxray.data.e2e_windows import E2EReader, ObsDataConfig, prepare_e2e
        from wxray.platform.train.datasets import e2e_dataset

        e2e = prepare_e2e(ObsDataConfig(store=args.store, obs_dir=args.obs, history=1,
                                        split_fractions=(1.0, 0.0, 0.0)), patch_size=1)
        data, reader = e2e.windows, E2EReader(e2e.spec, e2e.obs)

        def make_dataset(anchors, **kw):
            return e2e_dataset(e2e, anchors, **kw)
    else:
        data = prepare_windows(DataConfig(store=args.store, history=args.history, split_fractions=(1.0, 0.0, 0.0)))
        reader = WindowReader(data.spec)

        def make_dataset(anchors, **kw):
            return window_dataset(data.spec, anchors, **kw)
    # Several passes per measurement so Ray Data's start-up (planning, first tasks) is amortised as in training.
    anchors = np.tile(np.sort(data.anchors["train"]), args.passes)
    ray.init(address="local", num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    read_cpus = 1.0
    plain_loop(reader, np.unique(anchors), args.batch)  # warm the page cache for both paths
    plain, piped = [], []
    for _ in range(args.repeats):
        plain.append(plain_loop(reader, anchors, args.batch))
        piped.append(ray_pipeline(make_dataset, anchors, args.read_batch, args.batch, read_cpus))
    ray.shutdown()
    res = {
        "date": dt.date.today().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "store": args.store, "obs": args.obs, "grid": list(data.spec.grid), "channels_in": data.spec.n_in_channels,
        "windows": int(len(anchors)) // args.passes, "passes": args.passes, "read_batch": args.read_batch,
        "ray_cpus": args.cpus,
        "plain_samples_per_s": float(np.median(plain)), "ray_samples_per_s": float(np.median(piped)),
    }
    res["ratio_ray_over_plain"] = res["ray_samples_per_s"] / res["plain_samples_per_s"]
    print(f"{'path':<22}{'samples/s':>12}")
    print(f"{'plain loop (1 proc)':<22}{res['plain_samples_per_s']:>12.1f}")
    print(f"{'Ray Data map_batches':<22}{res['ray_samples_per_s']:>12.1f}")
    print(f"ratio Ray / plain: {res['ratio_ray_over_plain']:.2f}  ({res['windows']} windows x {args.passes} passes, "
          f"{args.cpus} CPUs)")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    print("RESULT " + json.dumps(res))


if __name__ == "__main__":
    main()
