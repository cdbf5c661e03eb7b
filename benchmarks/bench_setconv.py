"""SetConv points -> grid: time vs number of observations and grid size (separable vs dense weights).

    python benchmarks/bench_setconv.py                      # CPU, ~1 min on 2 cores
    python benchmarks/bench_setconv.py --device cuda --obs 1000 10000 100000 1000000 --grids 64x128 128x256

The separable SetConv costs O(N h w C) time (two contractions, never an (N, h*w) weight tensor); the dense
form builds the full (N, h, w) Gaussian weights. Per (grid, N) it reports:
  median ms   median wall time of one forward points_to_grid (batch 1, C channels, all observations present)
  min ms      fastest call (less sensitive to other processes on a shared machine); the figures below use it
  ns/op       min ms / (N h w): time per observation x grid pixel (flat when the cost is linear in N h w)
  dense ms    min ms of the dense (N, h, w) weight tensor form, where N h w <= --dense-max
  dense_x     dense ms / min ms
and a least-squares exponent k of time ~ (N h w)^k over the runs with N >= --fit-min (below that, fixed
per-call overhead dominates), overall and per grid (time ~ N^k at fixed grid). All calls run round-robin
over the cases, after one discarded warm-up round.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time

import torch

from wxray.models import SetConv, grid_spacing_deg


def dense_points_to_grid(ls: float, coords, values, mask, lat, lon):
    """Brute force: full (b, N, h, w) weights, wrapped longitude differences."""
    dlat = coords[..., 0, None, None] - lat[:, None]
    dlon = (coords[..., 1, None, None] - lon[None, :] + 180.0) % 360.0 - 180.0
    w = torch.exp(-0.5 * (dlat**2 + dlon**2) / ls**2)
    density = torch.einsum("bnhw,bnc->bchw", w, mask)
    value = torch.einsum("bnhw,bnc->bchw", w, mask * values) / density.clamp_min(1e-5)
    return torch.stack([density, value], dim=2).flatten(1, 2)


def timed(fn, device: torch.device) -> float:
    """Seconds of one call."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def fit_exponent(xs: list[float], ys: list[float]) -> float:
    """Slope of log y on log x (least squares)."""
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


def run(device, obs_counts, grids, channels, repeats, dense_max) -> list[dict]:
    cases = []  # (row, [(name, fn)])
    gen = torch.Generator().manual_seed(0)
    for h, w in grids:
        lat = torch.linspace(-90.0, 90.0, h, device=device)
        lon = (torch.arange(w) * 360.0 / w).to(device)
        ls = grid_spacing_deg(lat.cpu(), lon.cpu())
        sc = SetConv(ls).to(device)
        for n in obs_counts:
            lat_p, lon_p = torch.rand(1, n, generator=gen) * 180 - 90, torch.rand(1, n, generator=gen) * 360
            args = (torch.stack([lat_p, lon_p], -1).to(device), torch.randn(1, n, channels, generator=gen).to(device))
            args = (*args, torch.ones_like(args[1]), lat, lon)
            fns = [("ms", lambda sc=sc, a=args: sc.points_to_grid(*a))]
            if n * h * w <= dense_max:
                fns.append(("dense_ms", lambda ls=ls, a=args: dense_points_to_grid(ls, *a)))
            cases.append(({"grid": f"{h}x{w}", "h": h, "w": w, "n_obs": n}, fns))
    times: dict[tuple[int, str], list[float]] = {}
    with torch.no_grad():
        for i in range(repeats + 1):  # the first round is a discarded warm-up
            # round-robin over all cases, so load from other processes drifts over every size alike
            for c, (_, fns) in enumerate(cases):
                for name, fn in fns:
                    t = timed(fn, device)
                    if i:
                        times.setdefault((c, name), []).append(t)
    rows = []
    for c, (row, fns) in enumerate(cases):
        row = {**row, "dense_ms": None, "dense_min_ms": None}
        for name, _ in fns:
            ts = times[c, name]
            row[name] = 1e3 * statistics.median(ts)
            row[name.replace("ms", "min_ms")] = 1e3 * min(ts)
        row["ns_per_op"] = 1e6 * row["min_ms"] / (row["n_obs"] * row["h"] * row["w"])
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--obs", type=int, nargs="+", default=[100, 1_000, 10_000, 100_000],
                        help="numbers of observations")
    parser.add_argument("--grids", nargs="+", default=["32x64", "64x128", "128x256"], help="model grids h x w")
    parser.add_argument("--channels", type=int, default=3, help="variables per observation")
    parser.add_argument("--repeats", type=int, default=9, help="timed calls per case (median and min reported)")
    parser.add_argument("--dense-max", type=float, default=2.1e7, help="largest N*h*w the dense form is run at")
    parser.add_argument("--fit-min", type=int, default=1_000, help="smallest N in the exponent fit")
    parser.add_argument("--json", default=None, help="also write results to this JSON file")
    args = parser.parse_args()
    device = torch.device(args.device)
    grids = [tuple(int(x) for x in g.split("x")) for g in args.grids]

    t0 = time.perf_counter()
    rows = run(device, args.obs, grids, args.channels, args.repeats, args.dense_max)
    wall = time.perf_counter() - t0
    where = f"{args.device}, {torch.get_num_threads()} threads" if device.type == "cpu" else args.device
    print(f"SetConv points->grid, batch 1, C={args.channels}, {args.repeats} calls per case ({where}; {wall:.0f} s)")
    print()
    print("| grid | N obs | median ms | min ms | ns / (obs x pixel) | dense ms | dense / separable |")
    print("|------|------:|----------:|-------:|-------------------:|---------:|------------------:|")
    for r in rows:
        dense = "-" if r["dense_min_ms"] is None else f"{r['dense_min_ms']:.2f}"
        ratio = "-" if r["dense_min_ms"] is None else f"{r['dense_min_ms'] / r['min_ms']:.1f}x"
        print(f"| {r['grid']} | {r['n_obs']} | {r['ms']:.2f} | {r['min_ms']:.2f} | {r['ns_per_op']:.3f} "
              f"| {dense} | {ratio} |")
    fit = [r for r in rows if r["n_obs"] >= args.fit_min]
    size = [r["n_obs"] * r["h"] * r["w"] for r in fit]
    exponents = {"N h w, all grids": fit_exponent(size, [r["min_ms"] for r in fit])}
    for g in dict.fromkeys(r["grid"] for r in fit):
        sub = [r for r in fit if r["grid"] == g]
        if len(sub) > 1:
            exponents[f"N at {g}"] = fit_exponent([r["n_obs"] for r in sub], [r["min_ms"] for r in sub])
    print()
    print(f"fitted exponent k in min time ~ size^k (N >= {args.fit_min}): "
          + ", ".join(f"{k}: {v:.2f}" for k, v in exponents.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": where, "channels": args.channels, "repeats": args.repeats, "rows": rows,
                       "exponents": exponents, "torch": torch.__version__}, f, indent=2)


if __name__ == "__main__":
    main()
