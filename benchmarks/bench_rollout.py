"""A 16-member routing-ensemble rollout: members one at a time vs batched, eager vs compiled, in one run.

    python benchmarks/bench_rollout.py                                   # CPU: D=128, 32x64 grid (~2 min, 2 cores)
    python benchmarks/bench_rollout.py --device cuda --dim 256 --img 64 128 --bf16 --modes eager default reduce-overhead

The forecaster is bench_sparse.py's Res-Slim-ViT (depth 12, split (2, 8, 2), r = 0.25, random routing) with
random weights, rolled out `--steps` autoregressive steps from one initial state as `forecast/rollout.py`
rolls out a forecast job's members: member m draws its token selection from its own generator (seeds.py, the
coordinates (m,) of the init), each step's forecast is fed back as the newest history frame. "alone" runs the
members one per forward (batch 1, as a member is recomputed alone), "batched" all `--members` in one batch.

Per mode: rollout_ms (median over `--repeats` whole rollouts after one warm-up rollout per way, interleaved),
batched_x = alone / batched, mode_x = eager / this (same way), warmup_s (the first rollout: compilation), and
max_diff = max |batched - alone| over every member, lead and field: 0 where batched members are bit-identical to
members computed alone (the CPU, models/batch_invariance.py); on a GPU the kernels depend on the batch size, so
only the same batch recomputes the same bits.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from bench_sparse import DEPTH, HEADS, MLP_RATIO, N_CONST, PATCH, SPLIT

from wxray.forecast.rollout import per_sample_routing
from wxray.forecast.seeds import coordinate_generator
from wxray.models import ResSlimViT
from wxray.models.batch_invariance import batch_invariant
from wxray.models.compiled import COMPILE_MODES, compile_forecaster
from wxray.platform.cluster.devices import compute

N_VARS, HISTORY, KEEP = 5, 2, 0.25
INIT = "2020-01-01T00"


@torch.no_grad()
def roll(model, x0: torch.Tensor, members: list[int], batch: int, steps: int, bf16: bool) -> torch.Tensor:
    """(members, steps, V, h, w): each member's rollout from x0, `batch` members per forward."""
    out = []
    for start in range(0, len(members), batch):
        ids = members[start: start + batch]
        x = x0.expand(len(ids), *x0.shape[1:]).clone()
        gens = [coordinate_generator(0, INIT, m) for m in ids]
        leads = []
        with per_sample_routing(model, gens), compute(x0.device, torch.bfloat16 if bf16 else None):
            for _ in range(steps):
                y = model(x).float().clone()  # a CUDA-graph replay overwrites its output buffer on the next call
                leads.append(y)
                x = torch.cat([x[:, N_VARS: HISTORY * N_VARS], y, x[:, HISTORY * N_VARS:]], dim=1)
        out.append(torch.stack(leads, dim=1))
    return torch.cat(out)


def run(device: torch.device, members: int, steps: int, dim: int, img: tuple[int, int], bf16: bool,
        modes: tuple[str, ...], repeats: int) -> dict:
    torch.manual_seed(0)
    base = ResSlimViT(N_VARS, HISTORY, N_CONST, N_VARS, img, PATCH, dim, DEPTH, HEADS, MLP_RATIO, SPLIT,
                      KEEP).to(device).eval()
    x0 = torch.randn(1, N_VARS * HISTORY + N_CONST, *img, device=device, generator=torch.Generator(
        device=device).manual_seed(1))
    ids = list(range(members))
    ways = {"alone": 1, "batched": members}
    models = {mode: compile_forecaster(base, "off" if mode == "eager" else mode, device, say=lambda line: None)
              for mode in modes}
    times: dict[tuple[str, str], list[float]] = {}
    outputs: dict[tuple[str, str], torch.Tensor] = {}

    def timed(mode: str, way: str) -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        outputs[mode, way] = roll(models[mode], x0, ids, ways[way], steps, bf16)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.setdefault((mode, way), []).append(time.perf_counter() - t0)

    with batch_invariant(device):
        for mode in modes:
            for way in ways:
                timed(mode, way)  # warm-up rollout: compilation for a compiled mode
        for _ in range(repeats):
            for mode in modes:
                for way in ways:
                    timed(mode, way)
    results: dict[str, dict] = {}
    for mode in modes:
        r = {way: {"rollout_ms": 1e3 * statistics.median(times[mode, way][1:]),
                   "min_ms": 1e3 * min(times[mode, way][1:]), "warmup_s": times[mode, way][0]} for way in ways}
        r["batched_x"] = r["alone"]["rollout_ms"] / r["batched"]["rollout_ms"]
        r["max_diff"] = float((outputs[mode, "batched"] - outputs[mode, "alone"]).abs().max())
        results[mode] = r
    for mode in modes:
        for way in ways:
            results[mode][way]["mode_x"] = results[modes[0]][way]["rollout_ms"] / results[mode][way]["rollout_ms"]
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--members", type=int, default=16)
    parser.add_argument("--steps", type=int, default=4, help="autoregressive steps of each rollout")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--img", type=int, nargs=2, default=(32, 64), metavar=("H", "W"))
    parser.add_argument("--bf16", action="store_true", help="forward under bf16 autocast")
    parser.add_argument("--repeats", type=int, default=3, help="timed rollouts per way and mode (median reported)")
    parser.add_argument("--modes", nargs="+", choices=("eager", *COMPILE_MODES[1:]), default=["eager"])
    parser.add_argument("--json", default=None, help="also write results to this JSON file")
    args = parser.parse_args()
    if args.modes[0] != "eager":
        parser.error("--modes must start with eager (the reference of mode_x)")
    device = torch.device(args.device)
    img = tuple(args.img)
    seq = (img[0] // PATCH) * (img[1] // PATCH)
    results = run(device, args.members, args.steps, args.dim, img, args.bf16, tuple(args.modes), args.repeats)
    where = f"cpu, {torch.get_num_threads()} threads"
    if device.type == "cuda":
        where = f"{torch.cuda.get_device_name(device)}, {'bf16 autocast' if args.bf16 else 'fp32'}"
    print(f"{args.members} members x {args.steps} steps, L={seq} D={args.dim} depth={DEPTH} split={SPLIT} r={KEEP} "
          f"repeats={args.repeats} ({where})")
    header = (f"{'mode':16} {'way':8} {'rollout_ms':>11} {'min_ms':>9} {'batched_x':>10} {'mode_x':>7} "
              f"{'warmup_s':>9} {'max_diff':>9}")
    print(header)
    print("-" * len(header))
    for mode, r in results.items():
        for way in ("alone", "batched"):
            w = r[way]
            print(f"{mode:16} {way:8} {w['rollout_ms']:11.1f} {w['min_ms']:9.1f} "
                  f"{(r['batched_x'] if way == 'batched' else 1.0):9.2f}x {w['mode_x']:6.2f}x {w['warmup_s']:9.1f} "
                  f"{r['max_diff'] if way == 'batched' else 0.0:9.2g}")
    if args.json:
        config = {"members": args.members, "steps": args.steps, "L": seq, "dim": args.dim, "img": img,
                  "bf16": args.bf16, "modes": args.modes, "repeats": args.repeats, "device": where,
                  "torch": torch.__version__}
        with open(args.json, "w") as f:
            json.dump({"config": config, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
