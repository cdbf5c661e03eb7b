"""Peak memory and wall time of the evaluate job as inits, members and the grid grow; the CRPS beside `scores` and
xskillscore.

    python benchmarks/bench_evaluate_size.py [--budgets 64,4] [--tree DIR] [--workers 1 | --ray-tasks N]
                                             [--json out.json]

Synthetic truth (a store: one variable t2m, 6-hourly AR(1) fields, a small stats/climatology for ACC) and
ensemble forecasts (t2m at lead 24 h, K members around the truth, chunks of one init and 16 members) are
written to a temp dir; each
configuration then runs `jobs/evaluate.py forecast=... truth=... baseline=persistence` (plots on, tracking off)
in a fresh subprocess under /usr/bin/time (its peak RSS, %M; with workers > 1 the largest worker's is the
child's getrusage RUSAGE_CHILDREN), which reports the job's wall time. With --ray-tasks N the child runs
the Ray entry (`platform/ensemble/evaluate.evaluate_job`: blocks on N Ray tasks of a local cluster that the
child starts, its start-up counted in the wall time; the peak is the driver's). Sweeps, one size at a time around BASE:

    inits in INITS, members in MEMBERS (each at every block budget in --budgets, MiB: `block_mib`),
    grid in GRIDS (at the first budget)

A budget below the data (4 MiB) shows how the peak scales with inits and members at a fixed block size; the
default (64 MiB) holds every init of the smaller configurations in one block, so there the peak grows with the
data up to the budget (scoring holds ~4-5 blocks) and stays there. About 100 s on 2 CPUs (--tree: 50 s).

`import` is a process that imports the job and exits: peak - import is what scoring adds. The exponents are
least-squares slopes of log(value) against log(size) over a sweep (0: flat; 1: linear). `--tree DIR` runs
the children against another checkout's wxray (e.g. `git archive <rev> wxray | tar -x -C DIR`), without
the block keys it may not know. The fair CRPS (`ensemble.crps_terms(...).fair()`, the scorecard's) is timed
beside `scores.probability.crps_for_ensemble(method="fair")`, and the ECDF CRPS (`.ecdf()`) beside
`xskillscore.crps_ensemble` (properscoring's estimator; `pip install xskillscore numba`: without numba it
needs K x K floats per point; skipped when absent), on the
same float64 arrays (CRPS_SHAPE x K), values checked equal.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr
from scores.probability import crps_for_ensemble

ROOT = Path(__file__).resolve().parents[1]
# a child of --tree DIR imports that checkout's wxray (BENCH_TREE), every other process this one's
sys.path.insert(0, os.environ.get("BENCH_TREE") or str(ROOT))

from wxray.job import run_job  # noqa: E402
from wxray.verify import ensemble as ens  # noqa: E402
from wxray.verify.evaluate import EvaluateConfig, evaluate  # noqa: E402

INITS = (4, 16, 64)
MEMBERS = (4, 16, 64, 256)
GRIDS = ((32, 64), (64, 128), (128, 256))
BASE = {"inits": 16, "members": 16, "grid": (64, 128)}
BUDGETS = (64.0, 4.0)  # MiB per block: the default and a small one
CRPS_SHAPE = (16, 64, 128)  # inits x lat x lon of the CRPS timing
TIME = "/usr/bin/time"  # GNU time: a child's own peak RSS (%M)
LEAD_H = 24


def write_truth(path: Path, n_init: int, nlat: int, nlon: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    n_time = n_init + LEAD_H // 6 + 1
    times = pd.date_range("2020-01-01", periods=n_time, freq="6h")
    lat = np.linspace(-90 + 90 / nlat, 90 - 90 / nlat, nlat)
    lon = np.arange(nlon) * 360.0 / nlon
    x = np.empty((n_time, nlat, nlon), dtype=np.float32)
    x[0] = rng.standard_normal((nlat, nlon))
    for t in range(1, n_time):
        x[t] = 0.9 * x[t - 1] + np.sqrt(1 - 0.81) * rng.standard_normal((nlat, nlon))
    coords = {"time": times, "latitude": lat, "longitude": lon}
    ds = xr.Dataset({"t2m": (("time", "latitude", "longitude"), 280 + 5 * x, {"units": "K"})}, coords=coords)
    ds.to_zarr(path, mode="w", zarr_format=3, consolidated=False, encoding={"t2m": {"chunks": (1, nlat, nlon)}})
    days = np.arange(1, 1 + int(np.ceil(n_time / 4)) + 2)  # only the days the valid times need: small
    clim = xr.Dataset({"t2m": (("dayofyear", "hour", "latitude", "longitude"),
                               np.full((len(days), 4, nlat, nlon), 280.0, dtype=np.float32))},
                      coords={"dayofyear": days, "hour": [0, 6, 12, 18], "latitude": lat, "longitude": lon})
    clim.to_zarr(path, group="stats/climatology", mode="w", zarr_format=3, consolidated=False)


def write_forecast(path: Path, truth: Path, n_init: int, members: int, seed: int = 1) -> None:
    rng = np.random.default_rng(seed)
    t = xr.open_zarr(truth, consolidated=False)["t2m"]
    inits = t.time.values[:n_init]
    valid = t.sel(time=inits + np.timedelta64(LEAD_H, "h")).values
    nlat, nlon = valid.shape[1:]
    fc = valid[:, None, None] + rng.standard_normal((n_init, 1, members, nlat, nlon)).astype(np.float32)
    ds = xr.Dataset({"t2m": (("init_time", "lead_time", "member", "latitude", "longitude"), fc)},
                    coords={"init_time": inits, "lead_time": [np.timedelta64(LEAD_H, "h")],
                            "member": np.arange(members), "latitude": t.latitude.values,
                            "longitude": t.longitude.values})
    ds.to_zarr(path, mode="w", zarr_format=3, consolidated=False,
               encoding={"t2m": {"chunks": (1, 1, min(members, 16), nlat, nlon)}})  # chunks of 16 members


def child(args: list[str]) -> None:
    """Run the evaluate job in this process (or only import it: args == ["import"]); print its wall time and,
    with workers, the largest worker's peak RSS (MiB)."""
    t0 = time.perf_counter()
    main = evaluate
    if any(arg.startswith("ray_tasks=") for arg in args):
        from wxray.platform.ensemble.evaluate import evaluate_job as main  # the Ray entry: imports Ray
    rc = 0 if args == ["import"] else run_job("evaluate", EvaluateConfig, main, argv=args)
    wall = time.perf_counter() - t0
    workers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print("BENCH " + json.dumps({"rc": rc, "wall_s": wall, "worker_peak_mib": workers}))


def run_child(args: list[str], tree: str | None) -> dict:
    """The child's own peak RSS by /usr/bin/time: Linux keeps a process's maxrss across exec, so a child forked
    from this (larger) process would count this one's RSS; /usr/bin/time's child is forked from a small one."""
    env = dict(os.environ, BENCH_TREE=tree or "")
    proc = subprocess.run([TIME, "-f", "MAXRSS_KB %M", sys.executable, __file__, "--child", json.dumps(args)],
                          env=env, capture_output=True, text=True, cwd=tree or ROOT)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("BENCH ")]
    rss = [ln for ln in proc.stderr.splitlines() if ln.startswith("MAXRSS_KB ")]
    if proc.returncode or not lines or not rss or json.loads(lines[-1][6:])["rc"]:
        raise RuntimeError(f"evaluate {args}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    return {**json.loads(lines[-1][6:]), "peak_mib": int(rss[-1].split()[1]) / 1024}


def configs(budgets: tuple[float, ...]) -> list[dict]:
    out = []
    for budget in budgets:
        out += [{**BASE, "inits": n, "budget": budget, "sweep": "inits"} for n in INITS]
        out += [{**BASE, "members": k, "budget": budget, "sweep": "members"} for k in MEMBERS]
    out += [{**BASE, "grid": g, "budget": budgets[0], "sweep": "grid"} for g in GRIDS]
    return out


def slope(x, y) -> float:
    return float(np.polyfit(np.log(np.asarray(x, float)), np.log(np.asarray(y, float)), 1)[0])


def best_of(fn, repeat: int) -> tuple[float, xr.DataArray]:
    best, value = np.inf, None
    for _ in range(repeat):
        t0 = time.perf_counter()
        value = fn()
        best = min(best, time.perf_counter() - t0)
    return best, value


def max_rel_diff(a: xr.DataArray, b: xr.DataArray, dims: tuple[str, ...]) -> float:
    a, b = a.transpose(*dims).values, b.transpose(*dims).values
    return float(np.max(np.abs(a - b) / np.abs(b)))


def wxray_crps(fc: xr.DataArray, obs: xr.DataArray, kind: str) -> xr.DataArray:
    return getattr(ens.crps_terms(fc, obs, "member"), kind)()


def crps_timing(members: tuple[int, ...], repeat: int = 5) -> list[dict]:
    """The fair CRPS beside `scores`, the ECDF CRPS beside xskillscore (when installed): best-of-`repeat`
    seconds and the largest relative difference of the values."""
    try:  # here, not at the top: the evaluate children import this file, and their peak must not hold it
        import xskillscore
    except ImportError:  # an optional comparison (`pip install xskillscore`)
        xskillscore = None
    rng = np.random.default_rng(2)
    rows = []
    for k in members:
        dims = ("init_time", "latitude", "longitude")
        obs = xr.DataArray(rng.standard_normal(CRPS_SHAPE), dims=dims)
        fc = xr.DataArray(rng.standard_normal((k, *CRPS_SHAPE)), dims=("member", *dims))
        fair_s, fair = best_of(partial(wxray_crps, fc, obs, "fair"), repeat)
        scores_s, ref = best_of(partial(crps_for_ensemble, fc, obs, "member", method="fair", preserve_dims="all"),
                                repeat)
        row = {"members": k, "wxray_s": fair_s, "scores_s": scores_s, "max_rel_diff": max_rel_diff(fair, ref, dims)}
        if xskillscore is not None:
            ecdf_s, ecdf = best_of(partial(wxray_crps, fc, obs, "ecdf"), repeat)
            xs_s, xs = best_of(partial(xskillscore.crps_ensemble, obs, fc, member_dim="member", dim=[]), repeat)
            row.update(ecdf_s=ecdf_s, xskillscore_s=xs_s, ecdf_max_rel_diff=max_rel_diff(ecdf, xs, dims))
        rows.append(row)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--budgets", default=",".join(f"{b:g}" for b in BUDGETS), help="block_mib values (MiB)")
    p.add_argument("--tree", default=None, help="run the children against this checkout (no block keys)")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--ray-tasks", type=int, default=0, help="score the blocks on N Ray tasks (a local cluster)")
    p.add_argument("--no-crps", action="store_true")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    if a.child is not None:
        return child(json.loads(a.child))
    budgets = (0.0,) if a.tree else tuple(float(b) for b in a.budgets.split(","))
    start = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_evaluate_") as tmp:
        tmp = Path(tmp)
        base = run_child(["import"], a.tree)
        print(f"import: peak {base['peak_mib']:.0f} MiB", flush=True)
        for cfg in configs(budgets):
            (nlat, nlon), n, k = cfg["grid"], cfg["inits"], cfg["members"]
            truth = tmp / f"truth_{nlat}x{nlon}_{n}.zarr"
            if not truth.exists():
                write_truth(truth, n, nlat, nlon)
            fc = tmp / f"fc_{nlat}x{nlon}_{n}_{k}.zarr"
            if not fc.exists():
                write_forecast(fc, truth, n, k)
            args = [f"forecast={fc}", f"truth={truth}", "baseline=persistence", "tracking.enabled=false",
                    f"out_dir={tmp / 'runs' / fc.stem}_{cfg['budget']:g}"]
            if not a.tree:
                args += [f"block_mib={cfg['budget']}", f"workers={a.workers}"]
                args += [f"ray_tasks={a.ray_tasks}"] if a.ray_tasks else []
            r = run_child(args, a.tree)
            rows.append({**cfg, "grid": f"{nlat}x{nlon}", "points": nlat * nlon, **r,
                         "scoring_mib": r["peak_mib"] - base["peak_mib"]})
            print(f"{rows[-1]['sweep']:8s} budget {cfg['budget']:g} MiB  inits {n:3d}  members {k:3d}  grid "
                  f"{nlat}x{nlon}: peak {r['peak_mib']:.0f} MiB, {r['wall_s']:.1f} s", flush=True)
    crps = [] if a.no_crps else crps_timing(MEMBERS)
    report(rows, base, crps, budgets, a, time.perf_counter() - start)
    if a.json:
        Path(a.json).write_text(json.dumps({"import": base, "runs": rows, "crps": crps}, indent=1, default=str))


def report(rows: list[dict], base: dict, crps: list[dict], budgets, a, total: float) -> None:
    where = f"ray_tasks {a.ray_tasks}" if a.ray_tasks else f"workers {a.workers}"
    print(f"\n{'checkout ' + a.tree if a.tree else 'this checkout'}; {where}; {os.cpu_count()} CPUs; "
          f"import alone: peak {base['peak_mib']:.0f} MiB; total {total:.0f} s\n")
    extra = " largest worker's peak [MiB] |" if a.workers > 1 else ""
    print(f"| sweep | block_mib | inits | members | grid | peak RSS [MiB] | scoring (peak - import) [MiB] | "
          f"wall [s] |{extra}")
    print("|---|---|---|---|---|---|---|---|" + ("---|" if extra else ""))
    for r in rows:
        budget = "old code" if a.tree else f"{r['budget']:g}"
        worker = f" {r['worker_peak_mib']:.0f} |" if extra else ""
        print(f"| {r['sweep']} | {budget} | {r['inits']} | {r['members']} | {r['grid']} | {r['peak_mib']:.0f} | "
              f"{r['scoring_mib']:.0f} | {r['wall_s']:.1f} |{worker}")
    print("\nlog-log exponents (slope of log value vs log size over the sweep):\n")
    print("| sweep | block_mib | peak RSS | scoring memory | wall time |")
    print("|---|---|---|---|---|")
    for sweep, size in (("inits", "inits"), ("members", "members"), ("grid", "points")):
        for budget in budgets:
            sel = [r for r in rows if r["sweep"] == sweep and r["budget"] == budget]
            if len(sel) < 2:
                continue
            x = [r[size] for r in sel]
            scoring = [max(r["scoring_mib"], 1.0) for r in sel]
            peak, wall = slope(x, [r["peak_mib"] for r in sel]), slope(x, [r["wall_s"] for r in sel])
            label = "old code" if a.tree else f"{budget:g}"
            print(f"| {sweep} | {label} | {peak:.2f} | {slope(x, scoring):.2f} | {wall:.2f} |")
    if crps:
        xs = "xskillscore_s" in crps[0]
        print(f"\nCRPS per point of {' x '.join(map(str, CRPS_SHAPE))} float64 fields (best of 5):\n")
        print("| members | wxray crps_terms().fair() [s] | scores crps_for_ensemble(fair) [s] | max rel diff |"
              + (" wxray .ecdf() [s] | xskillscore crps_ensemble [s] | max rel diff |" if xs else ""))
        print("|---|---|---|---|" + ("---|---|---|" if xs else ""))
        for r in crps:
            print(f"| {r['members']} | {r['wxray_s']:.3f} | {r['scores_s']:.3f} | {r['max_rel_diff']:.1e} |"
                  + (f" {r['ecdf_s']:.3f} | {r['xskillscore_s']:.3f} | {r['ecdf_max_rel_diff']:.1e} |" if xs else ""))

if __name__ == "__main__":
    main()
