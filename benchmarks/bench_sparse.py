"""Sparse-Reslim training-step cost: dense vs sparse (residual delta) vs Sprint-style, stack and full model.

    python benchmarks/bench_sparse.py                       # CPU, batch 1, 8 timed steps (~2 min, 2 cores)
    python benchmarks/bench_sparse.py --device cuda --batch 8 --steps 20 --json out.json
    python benchmarks/bench_sparse.py --device cuda --bf16 --img 128 256     # bf16 autocast, L=8192
    python benchmarks/bench_sparse.py --device cuda --bf16 --modes eager reduce-overhead captured

Config (paper's base model, Sec. 4.1): D=256, depth 12, 4 heads, split (2, 8, 2), r=0.25, a 64x128 grid
with patch 2 -> L=2048 tokens, 5 variables x 2 history steps + 2 constants.

Per variant and part ("stack" = the 12-block router on random tokens with an MSE loss; "full" = the whole
model with the latitude-weighted MSE) it reports:
  step_ms    median wall time of forward + backward + AdamW step (after 2 warm-up steps; the six
             measurements are interleaved step by step so load drift hits all of them alike)
  min_ms     fastest of the timed steps (less sensitive to other processes on a shared machine)
  speedup    dense step_ms / this step_ms (same part and mode); min_x: the same from min_ms
  GFLOP      forward + backward FLOPs counted by torch.utils.flop_counter (CPU flash-SDPA registered)
  flop_x     dense GFLOP / this GFLOP
  saved_MiB  bytes of every tensor autograd saves during the forward (saved_tensors_hooks; a tensor
             saved twice counts twice, parameters included)
  mem_x      dense saved_MiB / this saved_MiB
  mode_x     eager step_ms / this step_ms (same variant and part): what compiling or capturing gains
  warmup_s   wall time of the warm-up steps (eager: one; compiled: compilation; captured: warm-up and capture)
With --modes, every variant and part runs once per mode ("full@captured"), all interleaved in one run.
and, beside them, the analytic block-stack speedups:
  paper        N / (n1 + n2 r^2 + n3)                        (Eq. 10, attention term only)
  exact        sum over blocks of c(n) = 12 n D^2 + 2 n^2 D  (linear layers scale with r, attention r^2)
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics

import torch
import torch.nn as nn
from step_bench import MODES, StepBench, print_table, profile

from wxray.models import (
    Block,
    ResSlimViT,
    SparseRouter,
    SprintRouter,
    SprintViT,
    lat_weighted_mse,
    latitude_weights,
)

DIM, DEPTH, HEADS, MLP_RATIO = 256, 12, 4, 4.0
SPLIT, KEEP = (2, 8, 2), 0.25
N_VARS, HISTORY, N_CONST, N_OUT = 5, 2, 2, 5
IMG, PATCH = (64, 128), 2
L = (IMG[0] // PATCH) * (IMG[1] // PATCH)


def block_cost(n: int, d: int = DIM, mlp_ratio: float = MLP_RATIO) -> float:
    """Multiply-adds of one block on n tokens.

    qkv + proj: 4 n D^2, MLP: 2 mlp_ratio n D^2, QK^T and AV: 2 n^2 D.
    """
    return (4 + 2 * mlp_ratio) * n * d * d + 2 * n * n * d


def expected_speedups(split: tuple[int, int, int] = SPLIT, r: float = KEEP, n: int = L) -> dict[str, float]:
    n1, n2, n3 = split
    k = math.floor(r * n)
    exact = (n1 + n2 + n3) * block_cost(n) / ((n1 + n3) * block_cost(n) + n2 * block_cost(k))
    return {"paper": (n1 + n2 + n3) / (n1 + n2 * r * r + n3), "exact": exact}


def make_stack(variant: str) -> nn.Module:
    blocks = [Block(DIM, HEADS, MLP_RATIO) for _ in range(DEPTH)]
    if variant == "dense":
        return SparseRouter(blocks, SPLIT, keep_ratio=1.0)
    if variant == "sparse":
        return SparseRouter(blocks, SPLIT, keep_ratio=KEEP)
    return SprintRouter(blocks, SPLIT, keep_ratio=KEEP, dim=DIM)


def make_model(variant: str, img: tuple[int, int] = IMG) -> nn.Module:
    cls = SprintViT if variant == "sprint" else ResSlimViT
    keep = 1.0 if variant == "dense" else KEEP
    return cls(N_VARS, HISTORY, N_CONST, N_OUT, img, PATCH, DIM, DEPTH, HEADS, MLP_RATIO, SPLIT, keep)


def row_key(part: str, mode: str) -> str:
    """A result row's part, with the mode where it is not eager ("full@captured")."""
    return part if mode == "eager" else f"{part}@{mode}"


def add_ratios(results: dict) -> None:
    """speedup (dense / this, same part and mode), FLOP and memory ratios, and mode_x (eager / this, same row)."""
    for variant in results:
        for key, r in results[variant].items():
            dense, eager = results["dense"][key], results[variant][key.split("@")[0]]
            r["speedup"] = dense["step_ms"] / r["step_ms"]
            r["speedup_min"] = dense["min_ms"] / r["min_ms"]
            r["flop_speedup"] = dense["GFLOP"] / r["GFLOP"]
            r["saved_reduction"] = dense["saved_MiB"] / r["saved_MiB"]
            r["mode_speedup"] = eager["step_ms"] / r["step_ms"]
            for call in ("call_ms",) if "call_ms" in r else ():
                r["call_speedup"] = dense[call] / r[call]
                r["call_mode_speedup"] = eager[call] / r[call]


def run(device: torch.device, steps: int, batch: int, img: tuple[int, int] = IMG, bf16: bool = False,
        profiled: bool = False, modes: tuple[str, ...] = ("eager",),
        variants: tuple[str, ...] = ("dense", "sparse", "sprint")) -> dict:
    torch.manual_seed(0)
    seq = (img[0] // PATCH) * (img[1] // PATCH)
    lat_w = latitude_weights(torch.linspace(-88.6, 88.6, img[0])).to(device)
    tokens = (torch.randn(batch, seq, DIM, device=device), torch.randn(batch, seq, DIM, device=device))
    fields = (
        torch.randn(batch, N_VARS * HISTORY + N_CONST, *img, device=device),
        torch.randn(batch, N_OUT, *img, device=device),
    )
    benches = {}
    for variant in variants:
        stack, model = make_stack(variant), make_model(variant, img)
        for mode in modes:  # every mode trains its own copy of the same initial weights
            s, m = (stack, model) if mode == modes[0] else (copy.deepcopy(stack), copy.deepcopy(model))
            benches[variant, row_key("stack", mode)] = StepBench(
                s, lambda mod, g: nn.functional.mse_loss(mod(tokens[0], generator=g).float(), tokens[1]),
                device, seed=1, bf16=bf16, mode=mode)
            benches[variant, row_key("full", mode)] = StepBench(
                m, lambda mod, g: lat_weighted_mse(mod(fields[0], generator=g).float(), fields[1], lat_w),
                device, seed=2, bf16=bf16, mode=mode)
    probes = {key: b.probe() for key, b in benches.items()}
    for b in benches.values():
        b.warm_up()  # eager: the second warm-up step, discarded; compiled / captured: until steady
    # round-robin, so load from other processes drifts over all variants alike
    for _ in range(steps):
        for b in benches.values():
            b.step()

    if profiled:
        for key in (("dense", "stack"), ("sparse", "stack")):
            profile(benches[key], " ".join(key))

    results: dict[str, dict[str, dict[str, float]]] = {}
    for (variant, key), b in benches.items():
        results.setdefault(variant, {})[key] = {
            "step_ms": 1e3 * statistics.median(b.times),
            "min_ms": 1e3 * min(b.times),
            "warmup_s": b.warmup_s,
            **probes[variant, key],
        }
    add_ratios(results)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per measurement (median reported)")
    parser.add_argument("--batch", type=int, default=None, help="default: 1 on cpu, 8 on cuda")
    parser.add_argument("--img", type=int, nargs=2, default=IMG, metavar=("H", "W"))
    parser.add_argument("--bf16", action="store_true", help="forward under bf16 autocast (loss and optimizer fp32)")
    parser.add_argument("--profile", action="store_true", help="print torch.profiler tables of the stack steps")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=["eager"],
                        help="eager, torch.compile modes, captured (CUDA graph of the whole step); the first is the "
                             "reference of mode_x")
    parser.add_argument("--variants", nargs="+", choices=("dense", "sparse", "sprint"),
                        default=["dense", "sparse", "sprint"], help="dense is always run (the reference of speedup)")
    parser.add_argument("--json", default=None, help="also write results to this JSON file")
    args = parser.parse_args()
    if args.modes[0] != "eager":
        parser.error("--modes must start with eager (the reference of mode_x)")
    variants = ("dense", *(v for v in args.variants if v != "dense"))
    device = torch.device(args.device)
    batch = args.batch or (1 if device.type == "cpu" else 8)
    img = tuple(args.img)
    seq = (img[0] // PATCH) * (img[1] // PATCH)

    results = run(device, args.steps, batch, img, args.bf16, args.profile, tuple(args.modes), variants)
    expected = expected_speedups(n=seq)
    where = f"{args.device}, {torch.get_num_threads()} threads" if device.type == "cpu" else args.device
    if device.type == "cuda":
        where = f"{torch.cuda.get_device_name(device)}, {'bf16 autocast' if args.bf16 else 'fp32'}"
    print(f"L={seq} D={DIM} depth={DEPTH} split={SPLIT} r={KEEP} batch={batch} steps={args.steps} ({where})")
    print(
        f"expected block-stack speedup: paper N/(n1+n2 r^2+n3) = {expected['paper']:.2f}x, "
        f"with linear terms = {expected['exact']:.2f}x"
    )
    print_table(results)
    if args.json:
        config = {
            "L": seq,
            "img": img,
            "bf16": args.bf16,
            "dim": DIM,
            "depth": DEPTH,
            "heads": HEADS,
            "split": SPLIT,
            "keep_ratio": KEEP,
            "batch": batch,
            "steps": args.steps,
            "modes": args.modes,
            "device": where,
            "torch": torch.__version__,
        }
        with open(args.json, "w") as f:
            json.dump({"config": config, "expected": expected, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
