"""jobs/forecast.py's peak memory and throughput as inits, members and the grid grow, and what an old tree gave.

    python benchmarks/bench_forecast_size.py                      # this tree, ~10 min on 2 cores
    python benchmarks/bench_forecast_size.py --tree /path/to/old/checkout --tree .   # before / after, one run

Each configuration is one `jobs/forecast.py` process (`/usr/bin/time` gives its peak RSS and wall time) on a
synthetic store of travelling waves (tests/tiny_store.py: geopotential and temperature at 500 hPa and a land-sea
mask, 6-hourly) with an untrained Res-Slim-ViT (D=32, depth 3, split (1,1,1), r=0.5, random routing: members
differ), `steps` leads of 6 h, batch_size 8, tracking off. Rows: inits 4 -> 64 (4 members), members 4 -> 256 (4
inits) at 64x128, and the grid 32x64 -> 128x256 (4 inits x 4 members). The output's float32 size is printed
beside the peak, and per tree a log-log fit of peak memory and wall time against inits and members (the
exponent: 0 = flat, 1 = linear). The job also scores what it wrote per lead against the store (its RESULT's
`rollout`), so the figures are the whole job's, not the rollout's alone.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.tiny_store import write_tiny_store  # noqa: E402
from wxray.config import to_dict  # noqa: E402
from wxray.data.schema import open_stats, open_store  # noqa: E402
from wxray.data.window_data import DataConfig  # noqa: E402
from wxray.data.windows import fit_spec, make_spec  # noqa: E402
from wxray.forecast import checkpoints  # noqa: E402
from wxray.models.registry import ModelConfig, build_forecaster, model_identity  # noqa: E402

GRIDS = {"32x64": (32, 64), "64x128": (64, 128), "128x256": (128, 256)}


def make_case(root: Path, grid: tuple[int, int], n_init: int) -> Path:
    """A store with `n_init` inits (one trajectory, truth at every lead) and a checkpoint of an untrained model."""
    store = root / f"store_{grid[0]}x{grid[1]}_{n_init}.zarr"
    write_tiny_store(store, n_traj=1, steps=n_init + 8, grid=grid, levels=(500,))
    data = DataConfig(store=str(store), history=1, lead_steps=1, levels=[500], grid_fit="crop")
    model_cfg = ModelConfig(embed_dim=32, depth=3, num_heads=2, split=(1, 1, 1), keep_ratio=0.5, skip_channels=8,
                            patch_size=4)
    spec = fit_spec(make_spec(str(store), open_store(store), open_stats(store), data), 4, "crop")
    torch.manual_seed(0)
    model = build_forecaster(model_cfg, spec)
    meta = {"model": model_identity(model_cfg, spec), "epoch": 1, "step": 1,
            "data": {**to_dict(data), "store": str(store)},
            checkpoints.NORMALISATION: checkpoints.normalisation_meta(spec)}
    return checkpoints.save(root / f"ckpt_{grid[0]}x{grid[1]}_{n_init}", {"model": model.state_dict()}, meta)


def run(tree: Path, ckpt: Path, n_init: int, members: int, steps: int, out: Path) -> dict:
    times = pd.date_range("2000-01-01", periods=n_init, freq="6h")
    argv = [f"checkpoint={ckpt}", f"out_dir={out}", "tracking.enabled=false", f"members={members}",
            f"steps={steps}", f"inits={times[0]:%Y-%m-%dT%H}/{times[-1]:%Y-%m-%dT%H}", "batch_size=8"]
    timing = out.parent / (out.name + ".time")
    env = {**os.environ, "PYTHONPATH": str(tree), "WXRAY_HOME": str(out.parent)}
    p = subprocess.run(["/usr/bin/time", "-o", str(timing), "-f", "%M %e", sys.executable,
                        str(tree / "jobs" / "forecast.py"), *argv], env=env, capture_output=True, text=True, cwd=tree)
    if p.returncode:
        raise SystemExit(f"{tree}: jobs/forecast.py failed:\n{p.stderr[-2000:]}")
    rss_kb, wall = timing.read_text().split()[-2:]
    return {"peak_mib": int(rss_kb) / 1024, "wall_s": float(wall)}


def slope(x, y) -> float:
    return float(np.polyfit(np.log(x), np.log(y), 1)[0])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tree", action="append", type=Path, help="a checkout to run jobs/forecast.py from (repeat)")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--inits", type=int, nargs="+", default=[4, 16, 64])
    ap.add_argument("--members", type=int, nargs="+", default=[4, 16, 64, 256])
    ap.add_argument("--grids", nargs="+", default=list(GRIDS))
    args = ap.parse_args()
    trees = [t.resolve() for t in (args.tree or [ROOT])]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        cases = [("inits", "64x128", n, 4) for n in args.inits] + \
                [("members", "64x128", 4, m) for m in args.members if m != 4] + \
                [("grid", g, 4, 4) for g in args.grids if g != "64x128"]
        ckpts = {}
        for _, g, n, _ in cases:
            if (g, n) not in ckpts:
                ckpts[g, n] = make_case(root, GRIDS[g], n)
        for k, (_, g, n, m) in enumerate(cases):
            h, w = GRIDS[g]
            out_mib = n * m * args.steps * 2 * h * w * 4 / 2**20  # two channels, float32
            for t, tree in enumerate(trees):
                res = run(tree, ckpts[g, n], n, m, args.steps, root / f"run{k}_{t}")
                rows.append({"tree": str(tree), "grid": g, "inits": n, "members": m, "output_mib": out_mib,
                             **res, "samples_per_s": n * m / res["wall_s"]})
                print(json.dumps(rows[-1]), flush=True)
    df = pd.DataFrame(rows)
    print("\n| tree | grid | inits | members | output MiB | peak MiB | wall s | samples/s |")
    print("|---|---|--:|--:|--:|--:|--:|--:|")
    for r in df.itertuples():
        print(f"| {Path(r.tree).name} | {r.grid} | {r.inits} | {r.members} | {r.output_mib:.1f} | {r.peak_mib:.0f} | "
              f"{r.wall_s:.1f} | {r.samples_per_s:.1f} |")
    print()
    for tree, d in df.groupby("tree"):
        a = d[(d.grid == "64x128") & (d.members == 4)]
        b = d[(d.grid == "64x128") & (d.inits == 4)]
        print(f"{Path(tree).name}: peak memory exponent in inits {slope(a.inits, a.peak_mib):.2f}, in members "
              f"{slope(b.members, b.peak_mib):.2f}; wall time exponent in inits {slope(a.inits, a.wall_s):.2f}, "
              f"in members {slope(b.members, b.wall_s):.2f}")


if __name__ == "__main__":
    main()
