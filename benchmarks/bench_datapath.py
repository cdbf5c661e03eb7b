"""The data path at the paper's shape: windows/s per read CPU from local disk and from a loopback S3 server.

    python benchmarks/bench_datapath.py [--steps 56] [--cpus 2] [--workdir /tmp/wxray-datapath] [--json out.json]

Generates (not in git) a store on the WeatherBench 2 1.40625-degree grid (128 x 256) with 82 channels (6
pressure-level variables x 13 levels + 4 surface fields), 6-hourly, in two chunk layouts:

* `chunk1-raw`: one time step per chunk, uncompressed (ARCO-ERA5's chunking);
* `chunk4-zstd`: four steps per chunk, zstd-compressed (WeatherBench 2 style).

Its fields are smooth waves plus noise (they compress about as ERA5 does in float32: a little); the statistics
groups hold placeholders (mean 0, std 1): reading speed does not depend on them. Each layout is read from local
disk and from a moto S3 server on 127.0.0.1 (its own process), in one run:

* raw: every chunk file of the fields the windows need, as bytes, one process (`fs.cat_file`): the medium's
  rate; locally twice, once after emptying the page cache (the disk; needs root, else left out) and once warm
  (the page cache, i.e. memory);
* plain: `WindowReader` in one process (zarr decode, stack, normalise), the loop a user would write;
* bare: the reader in `--cpus` parallel Ray tasks, outputs dropped: what the pipeline could reach on them;
* ray: the training pipeline (`window_dataset`: Ray Data read tasks of `--read-batch` windows, `iter_batches`)
  on `--cpus` read CPUs: its first pass (Ray Data's start-up, the read workers' imports) apart, then
  `--passes` passes timed; locally once more after emptying the page cache (from the disk).

The goal measured is the pipeline's total rate on its read CPUs over the medium's raw rate (locally the disk's,
caches dropped). A window (history 2, lead 1) reads 3 steps x 82 channels = 32.2 MB (float32). Peak RSS of the
driver and of one read task (the reader over 8 windows in batches of 4, in a Ray worker) is reported
beside. Ratios are what this measures; absolute numbers depend on the disk, the cores and the S3 server (moto
is Python, far slower than a real one).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import resource
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

LEVELS = [50, 100, 150, 200, 250, 300, 400, 500, 600, 700, 850, 925, 1000]
PRESSURE_VARS = ["geopotential", "temperature", "u_component_of_wind", "v_component_of_wind",
                 "specific_humidity", "vertical_velocity"]
SURFACE_VARS = ["2m_temperature", "10m_u_component_of_wind", "10m_v_component_of_wind", "mean_sea_level_pressure"]
GRID = (128, 256)


def make_store(path: Path, steps: int, time_chunk: int, compressed: bool) -> None:
    """The store in wxray's layout, written step block by step block (bounded memory)."""
    from zarr.codecs import ZstdCodec

    lat = np.linspace(-90 + 180 / GRID[0] / 2, 90 - 180 / GRID[0] / 2, GRID[0])
    lon = np.arange(GRID[1]) * 360.0 / GRID[1]
    times = pd.date_range("2020-01-01", periods=steps, freq="6h")
    rng = np.random.default_rng(0)
    lon_r, lat_r = np.deg2rad(lon), np.deg2rad(lat)
    enc_of = {"compressors": [ZstdCodec(level=3)] if compressed else None}
    for i0 in range(0, steps, time_chunk):
        i1 = min(steps, i0 + time_chunk)
        t = np.arange(i0, i1)[:, None, None]
        base = np.sin(2 * lon_r[None, None, :] - 0.3 * t) * np.cos(lat_r)[None, :, None]
        data = {}
        for k, v in enumerate(PRESSURE_VARS):
            lev = np.arange(len(LEVELS))[None, :, None, None]
            f = 10 * base[:, None] * (1 + 0.1 * lev) + k + rng.normal(scale=0.1, size=(i1 - i0, len(LEVELS), *GRID))
            data[v] = (("time", "level", "latitude", "longitude"), f.astype(np.float32))
        for k, v in enumerate(SURFACE_VARS):
            f = 10 * base + k + rng.normal(scale=0.1, size=(i1 - i0, *GRID))
            data[v] = (("time", "latitude", "longitude"), f.astype(np.float32))
        ds = xr.Dataset(data, coords={"time": times[i0:i1], "level": LEVELS, "latitude": lat, "longitude": lon})
        if i0 == 0:
            ds.attrs.update(grid_kind="global", longitude_convention="0-360")
            enc = {v: {"chunks": (time_chunk, *ds[v].shape[1:]), **enc_of} for v in data}
            enc["time"] = {"units": "hours since 2020-01-01", "dtype": "int64"}  # a 1-step block must not set days
            ds.to_zarr(path, zarr_format=3, consolidated=False, mode="w", encoding=enc)
        else:
            ds.to_zarr(path, zarr_format=3, consolidated=False, append_dim="time")
    stats = {}
    for name, value in (("mean", 0.0), ("std", 1.0), ("diff_mean", 0.0), ("diff_std", 1.0)):
        stats[name] = xr.Dataset({v: (("level",), np.full(len(LEVELS), value)) for v in PRESSURE_VARS}
                                 | {v: ((), value) for v in SURFACE_VARS}, coords={"level": LEVELS})
        stats[name].to_zarr(path, group=f"stats/{name}", zarr_format=3, consolidated=False, mode="w")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def raw_rate(store: str, times: np.ndarray) -> float:
    """Bytes/s of reading every chunk file of the fields at `times` (their time chunks), one process."""
    from wxray.data import location

    fs, root = location.filesystem(store)
    ds = location.open_zarr(store)
    chunk = ds[PRESSURE_VARS[0]].encoding["chunks"][0]
    files = []
    for v in PRESSURE_VARS + SURFACE_VARS:
        nd = ds[v].ndim
        files += [f"{root}/{v}/c/{c}" + "/0" * (nd - 1) for c in sorted({int(t) // chunk for t in times})]
    t0, n = time.perf_counter(), 0
    for f in files:
        n += len(fs.cat_file(f))
    return n / (time.perf_counter() - t0)


def window_bytes() -> int:
    return 3 * (len(PRESSURE_VARS) * len(LEVELS) + len(SURFACE_VARS)) * GRID[0] * GRID[1] * 4


def drop_page_cache() -> bool:
    """Empty the kernel's page cache (root only), so the next local read comes from the disk."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def read_windows(spec, anchors, batch: int) -> int:
    """Run the reader over `anchors` in batches of `batch` (outputs dropped); this process's peak RSS meanwhile,
    in bytes. A Ray worker runs many tasks: its high-water mark is reset first (Linux >= 4.0), so the peak is
    this call's alone."""
    from wxray.data.windows import WindowReader

    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass
    r = WindowReader(spec)
    for i in range(0, len(anchors), batch):
        r({"anchor": anchors[i: i + batch]})
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def peak_task_rss(spec, anchors) -> float:
    import ray

    return ray.get(ray.remote(num_cpus=1)(read_windows).remote(spec, anchors, 4))


def bare_tasks_rate(spec, anchors, cpus: int, read_batch: int) -> float:
    """Windows/s of the reader alone in `cpus` parallel Ray tasks, outputs dropped: the pipeline's ceiling."""
    import ray

    read = ray.remote(num_cpus=1)(read_windows)
    ray.get([read.remote(spec, anchors[:2], read_batch) for _ in range(cpus)])  # workers up, store opened
    t0 = time.perf_counter()
    # consecutive windows per task, as Ray Data's blocks hold them
    ray.get([read.remote(spec, part, read_batch) for part in np.array_split(anchors, cpus)])
    return len(anchors) / (time.perf_counter() - t0)


def pipeline_rate(spec, anchors, read_batch: int) -> float:
    from wxray.platform.train.datasets import window_dataset

    ds = window_dataset(spec, anchors, read_batch_size=read_batch, read_cpus=1.0)
    t0, n = time.perf_counter(), 0
    for out in ds.iter_batches(batch_size=8, batch_format="numpy"):
        n += len(out["anchor"])
    return n / (time.perf_counter() - t0)


def measure(store: str, cpus: int, read_batch: int, passes: int) -> dict:
    from wxray.data import location
    from wxray.data.window_data import DataConfig, prepare_windows
    from wxray.data.windows import WindowReader

    local = not location.is_remote(store)
    data = prepare_windows(DataConfig(store=store, history=2, split_fractions=(1.0, 0.0, 0.0)))
    anchors = np.sort(data.anchors["train"])
    needed = np.unique(np.concatenate([anchors - 1, anchors, anchors + 1]))
    row = {"windows": int(len(anchors)), "channels_in": int(data.spec.n_in_channels)}
    if local and drop_page_cache():
        row["raw_cold_MB_per_s"] = raw_rate(store, needed) / 1e6
    row["raw_MB_per_s"] = raw_rate(store, needed) / 1e6  # local: the page cache, warmed by the line above
    reader = WindowReader(data.spec)
    reader({"anchor": anchors[:2]})  # open once: metadata and constants outside the timing
    t0 = time.perf_counter()
    for _ in range(passes):
        for i in range(0, len(anchors), 4):
            reader({"anchor": anchors[i: i + 4]})
    row["plain_windows_per_s"] = passes * len(anchors) / (time.perf_counter() - t0)
    row["bare_tasks_windows_per_s"] = bare_tasks_rate(data.spec, np.tile(anchors, passes), cpus, read_batch)
    # The first pass pays Ray Data's start-up and the read workers' imports: reported apart, not averaged in.
    row["ray_first_pass_windows_per_s"] = pipeline_rate(data.spec, anchors, read_batch)
    row["ray_windows_per_s"] = pipeline_rate(data.spec, np.tile(anchors, passes), read_batch)
    if local and drop_page_cache():
        row["ray_cold_windows_per_s"] = pipeline_rate(data.spec, anchors, read_batch)
    row["task_peak_rss_MB"] = peak_task_rss(data.spec, anchors[:8]) / 1e6
    row["ray_windows_per_s_per_cpu"] = row["ray_windows_per_s"] / cpus
    raw_medium = row.get("raw_cold_MB_per_s", row["raw_MB_per_s"]) * 1e6 / window_bytes()
    row["raw_windows_per_s"] = raw_medium
    row["ray_over_raw"] = row.get("ray_cold_windows_per_s", row["ray_windows_per_s"]) / raw_medium
    row["ray_over_bare_tasks"] = row["ray_windows_per_s"] / row["bare_tasks_windows_per_s"]
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=56, help="6-hourly steps (56 = two weeks)")
    p.add_argument("--cpus", type=int, default=os.cpu_count() or 2)
    p.add_argument("--read-batch", type=int, default=8)
    p.add_argument("--passes", type=int, default=2)
    p.add_argument("--workdir", default="/tmp/wxray-datapath")
    p.add_argument("--json", default="")
    args = p.parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    layouts = {"chunk1-raw": (1, False), "chunk4-zstd": (4, True)}
    for name, (chunk, comp) in layouts.items():
        if not (work / f"{name}.zarr" / "zarr.json").exists():
            print(f"generating {name} ({args.steps} steps) ...", flush=True)
            shutil.rmtree(work / f"{name}.zarr", ignore_errors=True)
            make_store(work / f"{name}.zarr", args.steps, chunk, comp)

    port = free_port()
    os.environ.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_ACCESS_KEY_ID="bench",
                      AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import ray
    import ray.data

    from wxray.data import location

    try:
        for _ in range(50):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.2)
        fs, _ = location.filesystem("s3://bench")
        fs.mkdir("bench")
        for name in layouts:
            fs.put(str(work / f"{name}.zarr"), f"bench/{name}.zarr", recursive=True)
        ray.init(address="local", num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
        ray.data.DataContext.get_current().enable_progress_bars = False
        rows = {}
        for name in layouts:
            for medium, store in (("local", str(work / f"{name}.zarr")), ("s3", f"s3://bench/{name}.zarr")):
                print(f"measuring {name} from {medium} ...", flush=True)
                rows[f"{name}/{medium}"] = measure(store, args.cpus, args.read_batch, args.passes)
        ray.shutdown()
    finally:
        server.terminate()
    size = {n: sum(f.stat().st_size for f in (work / f"{n}.zarr").rglob("*") if f.is_file()) / 1e9 for n in layouts}
    res = {"date": dt.date.today().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
           "grid": list(GRID), "channels": len(PRESSURE_VARS) * len(LEVELS) + len(SURFACE_VARS),
           "steps": args.steps, "window_MB": window_bytes() / 1e6, "cpus": args.cpus, "read_batch": args.read_batch,
           "store_GB": size, "driver_peak_rss_MB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6,
           "rows": rows}
    cols = [("raw MB/s", "raw_MB_per_s"), ("cold MB/s", "raw_cold_MB_per_s"), ("plain", "plain_windows_per_s"),
            ("bare", "bare_tasks_windows_per_s"), ("ray 1st", "ray_first_pass_windows_per_s"),
            ("ray", "ray_windows_per_s"), ("ray cold", "ray_cold_windows_per_s"), ("ray/raw", "ray_over_raw"),
            ("ray/bare", "ray_over_bare_tasks"), ("task MB", "task_peak_rss_MB")]
    print(f"{'layout/medium':<22}" + "".join(f"{c:>10}" for c, _ in cols))
    for key, r in rows.items():
        print(f"{key:<22}" + "".join(f"{r[k]:>10.2f}" if k in r else f"{'-':>10}" for _, k in cols))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    print("RESULT " + json.dumps(res))


if __name__ == "__main__":
    main()
