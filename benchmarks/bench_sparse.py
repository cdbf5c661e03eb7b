"""Sparse-Reslim training-step cost: dense vs sparse (residual delta) vs Sprint-style, stack and full model.

    python benchmarks/bench_sparse.py                       # CPU, batch 1, 8 timed steps (~2 min, 2 cores)
    python benchmarks/bench_sparse.py --device cuda --batch 8 --steps 20 --json out.json
    python benchmarks/bench_sparse.py --device cuda --bf16 --img 128 256     # bf16 autocast, L=8192

Config (paper's base model, Sec. 4.1): D=256, depth 12, 4 heads, split (2, 8, 2), r=0.25, a 64x128 grid
with patch 2 -> L=2048 tokens, 5 variables x 2 history steps + 2 constants.

Per variant and part ("stack" = the 12-block router on random tokens with an MSE loss; "full" = the whole
model with the latitude-weighted MSE) it reports:
  step_ms    median wall time of forward + backward + AdamW step (after 2 warm-up steps; the six
             measurements are interleaved step by step so load drift hits all of them alike)
  min_ms     fastest of the timed steps (less sensitive to other processes on a shared machine)
  speedup    dense step_ms / this step_ms (same part); min_x: the same from min_ms
  GFLOP      forward + backward FLOPs counted by torch.utils.flop_counter (CPU flash-SDPA registered)
  flop_x     dense GFLOP / this GFLOP
  saved_MiB  bytes of every tensor autograd saves during the forward (saved_tensors_hooks; a tensor
             saved twice counts twice, parameters included)
  mem_x      dense saved_MiB / this saved_MiB
and, beside them, the analytic block-stack speedups:
  paper        N / (n1 + n2 r^2 + n3)                        (Eq. 10, attention term only)
  exact        sum over blocks of c(n) = 12 n D^2 + 2 n^2 D  (linear layers scale with r, attention r^2)
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn as nn
from torch.utils import flop_counter

from wxray.models import (
    Block,
    ResSlimViT,
    SparseRouter,
    SprintRouter,
    SprintViT,
    lat_weighted_mse,
    latitude_weights,
)
from wxray.platform.accelerators import compute

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


def _sdpa_cpu_flops() -> dict:
    """flop_counter does not know the CPU flash-attention kernels that SDPA dispatches to; register them."""
    aten = torch.ops.aten

    def fwd(q, k, v, *args, out_shape=None, **kwargs):
        return flop_counter.sdpa_flop_count(q, k, v)

    def bwd(grad, q, k, v, *args, out_shape=None, **kwargs):
        return flop_counter.sdpa_backward_flop_count(grad, q, k, v)

    return {
        aten._scaled_dot_product_flash_attention_for_cpu: fwd,
        aten._scaled_dot_product_flash_attention_for_cpu_backward: bwd,
    }


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


class Bench:
    """One module + optimizer + fixed batch; `probe()` counts FLOPs and saved bytes, `step()` times a step."""

    def __init__(self, module: nn.Module, batch: tuple, loss_fn: Callable, device: torch.device, seed: int,
                 bf16: bool = False):
        self.module = module.to(device).train()
        # as the training loops run a forward: bf16 autocast on the device's best attention kernels
        self.amp = lambda: compute(device, torch.bfloat16 if bf16 else None)
        self.opt = torch.optim.AdamW(module.parameters(), lr=1e-4)
        self.gen = torch.Generator(device=device).manual_seed(seed)
        self.x, self.target = batch
        self.loss_fn, self.device = loss_fn, device
        self.times: list[float] = []

    def _step(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        with self.amp():
            pred = self.module(self.x, generator=self.gen)
        self.loss_fn(pred.float(), self.target).backward()
        self.opt.step()

    def probe(self) -> dict[str, float]:
        """A warm-up step under FlopCounterMode (fwd + bwd FLOPs) and saved_tensors_hooks (forward only)."""
        saved = 0

        def pack(t: torch.Tensor) -> torch.Tensor:
            nonlocal saved
            saved += t.numel() * t.element_size()
            return t

        with flop_counter.FlopCounterMode(display=False, custom_mapping=_sdpa_cpu_flops()) as counter:
            self.opt.zero_grad(set_to_none=True)
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), self.amp():
                pred = self.module(self.x, generator=self.gen)
            loss = self.loss_fn(pred.float(), self.target)
            loss.backward()
            self.opt.step()
        return {"GFLOP": counter.get_total_flops() / 1e9, "saved_MiB": saved / 2**20}

    def step(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        t0 = time.perf_counter()
        self._step()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.times.append(time.perf_counter() - t0)


def profile(bench: Bench, name: str, steps: int = 3, rows: int = 12) -> None:
    """Where a step's time goes: torch.profiler's top ops by self device time (CPU time off GPUs)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    cuda = bench.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch_profile(activities=activities) as prof:
        for _ in range(steps):
            bench.step()
    bench.times = bench.times[:-steps]
    print(f"--- profile: {name}, {steps} steps")
    print(prof.key_averages().table(sort_by="self_cuda_time_total" if cuda else "self_cpu_time_total",
                                    row_limit=rows, max_name_column_width=48))


def run(device: torch.device, steps: int, batch: int, img: tuple[int, int] = IMG, bf16: bool = False,
        profiled: bool = False) -> dict:
    torch.manual_seed(0)
    seq = (img[0] // PATCH) * (img[1] // PATCH)
    lat_w = latitude_weights(torch.linspace(-88.6, 88.6, img[0])).to(device)
    tokens = (torch.randn(batch, seq, DIM, device=device), torch.randn(batch, seq, DIM, device=device))
    fields = (
        torch.randn(batch, N_VARS * HISTORY + N_CONST, *img, device=device),
        torch.randn(batch, N_OUT, *img, device=device),
    )
    benches = {}
    for variant in ("dense", "sparse", "sprint"):
        benches[variant, "stack"] = Bench(make_stack(variant), tokens, nn.functional.mse_loss, device, seed=1,
                                          bf16=bf16)
        benches[variant, "full"] = Bench(
            make_model(variant, img), fields, lambda p, t: lat_weighted_mse(p, t, lat_w), device, seed=2, bf16=bf16
        )
    probes = {key: b.probe() for key, b in benches.items()}
    for b in benches.values():
        b.step()  # second warm-up step, discarded
        b.times.clear()
    # round-robin, so load from other processes drifts over all variants alike
    for _ in range(steps):
        for b in benches.values():
            b.step()

    if profiled:
        for key in (("dense", "stack"), ("sparse", "stack")):
            profile(benches[key], " ".join(key))

    results: dict[str, dict[str, dict[str, float]]] = {}
    for (variant, part), b in benches.items():
        results.setdefault(variant, {})[part] = {
            "step_ms": 1e3 * statistics.median(b.times),
            "min_ms": 1e3 * min(b.times),
            **probes[variant, part],
        }
    for variant in results:
        for part, r in results[variant].items():
            dense = results["dense"][part]
            r["speedup"] = dense["step_ms"] / r["step_ms"]
            r["speedup_min"] = dense["min_ms"] / r["min_ms"]
            r["flop_speedup"] = dense["GFLOP"] / r["GFLOP"]
            r["saved_reduction"] = dense["saved_MiB"] / r["saved_MiB"]
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per measurement (median reported)")
    parser.add_argument("--batch", type=int, default=None, help="default: 1 on cpu, 8 on cuda")
    parser.add_argument("--img", type=int, nargs=2, default=IMG, metavar=("H", "W"))
    parser.add_argument("--bf16", action="store_true", help="forward under bf16 autocast (loss and optimizer fp32)")
    parser.add_argument("--profile", action="store_true", help="print torch.profiler tables of the stack steps")
    parser.add_argument("--json", default=None, help="also write results to this JSON file")
    args = parser.parse_args()
    device = torch.device(args.device)
    batch = args.batch or (1 if device.type == "cpu" else 8)
    img = tuple(args.img)
    seq = (img[0] // PATCH) * (img[1] // PATCH)

    results = run(device, args.steps, batch, img, args.bf16, args.profile)
    expected = expected_speedups(n=seq)
    where = f"{args.device}, {torch.get_num_threads()} threads" if device.type == "cpu" else args.device
    if device.type == "cuda":
        where = f"{torch.cuda.get_device_name(device)}, {'bf16 autocast' if args.bf16 else 'fp32'}"
    print(f"L={seq} D={DIM} depth={DEPTH} split={SPLIT} r={KEEP} batch={batch} steps={args.steps} ({where})")
    print(
        f"expected block-stack speedup: paper N/(n1+n2 r^2+n3) = {expected['paper']:.2f}x, "
        f"with linear terms = {expected['exact']:.2f}x"
    )
    header = (
        f"{'variant':8} {'part':6} {'step_ms':>9} {'min_ms':>9} {'speedup':>8} {'min_x':>6} "
        f"{'GFLOP':>8} {'flop_x':>7} {'saved_MiB':>10} {'mem_x':>6}"
    )
    print(header)
    print("-" * len(header))
    for variant, parts in results.items():
        for part, r in parts.items():
            print(
                f"{variant:8} {part:6} {r['step_ms']:9.1f} {r['min_ms']:9.1f} "
                f"{r['speedup']:7.2f}x {r['speedup_min']:5.2f}x "
                f"{r['GFLOP']:8.1f} {r['flop_speedup']:6.2f}x "
                f"{r['saved_MiB']:10.1f} {r['saved_reduction']:5.2f}x"
            )
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
            "device": where,
            "torch": torch.__version__,
        }
        with open(args.json, "w") as f:
            json.dump({"config": config, "expected": expected, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
