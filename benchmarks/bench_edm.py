"""Res-Slim-EDM training-step cost: dense vs sparse (asymmetric attention), block stack and full denoiser.

    python benchmarks/bench_edm.py                       # CPU, batch 1, 6 timed steps (~4 min, 2 cores)
    python benchmarks/bench_edm.py --img 32 64 --steps 12  # L=512 (~30 s, 2 cores)
    python benchmarks/bench_edm.py --device cuda --batch 8 --steps 20 --json out.json
    python benchmarks/bench_edm.py --device cuda --bf16     # the forward (loss included) under bf16 autocast
    python benchmarks/bench_edm.py --device cuda --bf16 --modes eager reduce-overhead captured

Config (defaults): D=256, depth 8, 4 heads, MLP ratio 4, split (2, 4, 2), r=0.25 (the paper's EDM split and
ratio, Sec. 4.3), a 64x128 grid with patch 2 -> L=2048 tokens, K=512 routed; 5 variables x 2 history steps
+ 2 constants, 5 outputs.

Parts: "stack" = the 8 EDMBlocks in their SparseRouter on random target tokens (B, L, D), conditioning tokens
(B, L, D) and noise embedding (B, D), MSE loss; "full" = the whole denoiser with edm_loss (sigma and noise
drawn from the step's generator, a fresh routing every step, latitude-weighted). Per variant and part:
  step_ms    median wall time of forward + backward + AdamW step (after 2 warm-up steps; measurements
             interleaved step by step so load drift hits all of them alike); min_ms the fastest step
  speedup    dense step_ms / this step_ms (same part); min_x from min_ms (the steadier ratio on a
             machine shared with other jobs)
  GFLOP      forward + backward FLOPs (torch.utils.flop_counter, CPU flash-SDPA registered); flop_x ratio
  saved_MiB  bytes of every tensor autograd saves during the forward (parameters included); mem_x ratio
  call_ms    (full only) median of one no-grad denoiser call with a held routing, i.e. one sampler call
  mode_x     eager / this (same variant and part), call_mode_x the same for call_ms; warmup_s the warm-up
             steps' wall time (compilation, capture), reported apart (see bench_sparse.py)
and the FLOP model of the asymmetric block (multiply-adds, n = tokens the block sees, L = conditioning length):
  c(n) = 4 n D^2 + 2 n^2 D          self-attention: qkv + proj, scores + AV over n tokens
       + 2 n D^2 + 2 L D^2 + 2 n L D  cross-attention: q + proj on n, k + v on all L of Z_c, n x L scores + AV
       + 2 m n D^2                    MLP (m = MLP ratio); FiLM / gate are per sample (5 D^2), left out
  speedup = N c(L) / ((n1 + n3) c(L) + n2 c(K)); "attention only" keeps the n^2 D and n L D terms (Eq. 12).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import statistics
import time

import torch
import torch.nn as nn
from bench_sparse import add_ratios, row_key
from step_bench import MODES, WARMUP_STEPS, StepBench, print_table

from wxray.models import EDMBlock, ResSlimEDM, SparseRouter, edm_loss, latitude_weights

DEPTH, HEADS, MLP_RATIO = 8, 4, 4.0
SPLIT, KEEP = (2, 4, 2), 0.25
N_VARS, HISTORY, N_CONST, N_OUT, PATCH = 5, 2, 2, 5, 2
PAPER = {"L": 30 * 60, "dim": 1024, "measured": 1.82}  # Sec. 4.3 / Table 7: 1.0 deg (180x360), patch 6, D=1024
# The sampler's denoiser call (forward only, no grad), for the parts that time one: ms, vs dense, vs eager.
CALL_COLUMNS = (
    ("call_ms", 8, lambda r: f"{r['call_ms']:.1f}" if "call_ms" in r else "-"),
    ("call_x", 6, lambda r: f"{r['call_speedup']:.2f}x" if "call_ms" in r else "-"),
    ("call_mode_x", 11, lambda r: f"{r['call_mode_speedup']:.2f}x" if "call_ms" in r else "-"),
)


def block_cost(n: int, seq: int, d: int, mlp_ratio: float = MLP_RATIO, attention_only: bool = False) -> float:
    """Multiply-adds of one EDM block on n tokens of x against seq conditioning tokens (see module doc)."""
    attention = 2 * n * n * d + 2 * n * seq * d
    if attention_only:
        return attention
    return attention + (4 + 2 + 2 * mlp_ratio) * n * d * d + 2 * seq * d * d


def expected_speedups(seq: int, d: int, split: tuple[int, int, int] = SPLIT, r: float = KEEP) -> dict[str, float]:
    n1, n2, n3 = split
    k = math.floor(r * seq)

    def ratio(**kw: bool) -> float:
        dense = block_cost(seq, seq, d, **kw)
        return (n1 + n2 + n3) * dense / ((n1 + n3) * dense + n2 * block_cost(k, seq, d, **kw))

    return {"attention_only": ratio(attention_only=True), "flop_model": ratio()}


def make_model(keep: float, dim: int, img: tuple[int, int]) -> ResSlimEDM:
    return ResSlimEDM(N_VARS, HISTORY, N_CONST, N_OUT, img, PATCH, dim, DEPTH, HEADS, MLP_RATIO, SPLIT, keep)


def run(device: torch.device, steps: int, batch: int, dim: int, img: tuple[int, int], bf16: bool = False,
        modes: tuple[str, ...] = ("eager",)) -> dict:
    torch.manual_seed(0)
    seq = (img[0] // PATCH) * (img[1] // PATCH)
    lat_w = latitude_weights(torch.linspace(-88.6, 88.6, img[0])).to(device)
    z_x, z_c, target = (torch.randn(batch, seq, dim, device=device) for _ in range(3))
    emb = torch.randn(batch, dim, device=device)
    fields = torch.randn(batch, N_OUT, *img, device=device)
    cond = torch.randn(batch, N_VARS * HISTORY + N_CONST, *img, device=device)
    benches, models = {}, {}
    for variant, keep in (("dense", 1.0), ("sparse", KEEP)):
        stack = SparseRouter([EDMBlock(dim, HEADS, MLP_RATIO) for _ in range(DEPTH)], SPLIT, keep)
        model = make_model(keep, dim, img)
        for mode in modes:  # every mode trains its own copy of the same initial weights
            s, m = (stack, model) if mode == modes[0] else (copy.deepcopy(stack), copy.deepcopy(model))
            benches[variant, row_key("stack", mode)] = StepBench(
                s, lambda mod, g: nn.functional.mse_loss(mod(z_x, generator=g, cond=z_c, emb=emb), target),
                device, seed=1, bf16=bf16, mode=mode)
            benches[variant, row_key("full", mode)] = StepBench(
                m, lambda mod, g: edm_loss(mod, fields, cond, lat_w, g), device, seed=2, bf16=bf16, mode=mode)
            models[variant, mode] = m
    probes = {key: b.probe() for key, b in benches.items()}
    for b in benches.values():
        b.warm_up()  # eager: the second warm-up step, discarded; compiled / captured: until steady
    for _ in range(steps):  # round-robin, so load from other processes drifts over all variants alike
        for b in benches.values():
            b.step()

    call_ms, call_warmup = {}, {}
    for (variant, mode), model in models.items():  # one sampler call: no grad, routing held
        bench = benches[variant, row_key("full", mode)]
        model.eval()
        g = torch.Generator(device=device).manual_seed(3)
        routing = model.draw_routing(batch, g, device)
        sigma = torch.full((), 1.0, device=device)  # a tensor, as the sampler passes it
        bench.sync()
        t_build = time.perf_counter()
        call = sampler_call(bench.module, mode, fields, sigma, cond, g, routing, bench.amp)  # "captured": captures
        bench.sync()
        times, build_s = [], time.perf_counter() - t_build
        for _ in range(steps + (1 if mode == "eager" else WARMUP_STEPS + 2)):
            bench.sync()
            t0 = time.perf_counter()
            call()
            bench.sync()
            times.append(time.perf_counter() - t0)
        warm = 1 if mode == "eager" else WARMUP_STEPS + 2
        call_ms[variant, mode] = 1e3 * statistics.median(times[warm:])
        call_warmup[variant, mode] = build_s + sum(times[:warm])

    results: dict[str, dict[str, dict[str, float]]] = {}
    for (variant, key), b in benches.items():
        r = {"step_ms": 1e3 * statistics.median(b.times), "min_ms": 1e3 * min(b.times), "warmup_s": b.warmup_s,
             **probes[variant, key]}
        part, _, mode = key.partition("@")
        if part == "full":
            r["call_ms"] = call_ms[variant, mode or "eager"]
            r["call_warmup_s"] = call_warmup[variant, mode or "eager"]
        results.setdefault(variant, {})[key] = r
    add_ratios(results)
    return results


def sampler_call(model, mode: str, y, sigma, cond, g, routing, amp):
    """One no-grad denoiser call, as the sampler makes it: eager or compiled as the model is, or (captured) a
    CUDA graph of the call recorded once on static inputs and replayed."""
    def call():
        with torch.no_grad(), amp():
            return model(y, sigma, cond, generator=g, routing=routing)

    if mode != "captured":
        return call
    side = torch.cuda.Stream(y.device)
    side.wait_stream(torch.cuda.current_stream(y.device))
    with torch.cuda.stream(side):
        for _ in range(WARMUP_STEPS):
            call()
    torch.cuda.current_stream(y.device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    return graph.replay


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--steps", type=int, default=6, help="timed steps per measurement (median reported)")
    parser.add_argument("--batch", type=int, default=None, help="default: 1 on cpu, 8 on cuda")
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--img", type=int, nargs=2, default=(64, 128), metavar=("H", "W"))
    parser.add_argument("--threads", type=int, default=None, help="intra-op threads (default: torch's)")
    parser.add_argument("--bf16", action="store_true", help="forward under bf16 autocast (optimizer fp32)")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=["eager"],
                        help="eager, torch.compile modes, captured (CUDA graphs of the step and of the call)")
    parser.add_argument("--json", default=None, help="also write results to this JSON file")
    args = parser.parse_args()
    if args.modes[0] != "eager":
        parser.error("--modes must start with eager (the reference of mode_x)")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    batch = args.batch or (1 if device.type == "cpu" else 8)
    img = tuple(args.img)
    seq = (img[0] // PATCH) * (img[1] // PATCH)

    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    results = run(device, args.steps, batch, args.dim, img, args.bf16, tuple(args.modes))
    expected = expected_speedups(seq, args.dim)
    paper = expected_speedups(PAPER["L"], PAPER["dim"])
    where = f"{args.device}, {torch.get_num_threads()} threads" if device.type == "cpu" else args.device
    if device.type == "cuda":
        where = f"{torch.cuda.get_device_name(device)}, {'bf16 autocast' if args.bf16 else 'fp32'}"
    print(f"L={seq} K={math.floor(KEEP * seq)} D={args.dim} depth={DEPTH} split={SPLIT} r={KEEP} batch={batch} "
          f"steps={args.steps} ({where}; {time.perf_counter() - t0:.0f} s; load average {load0:.1f} -> "
          f"{os.getloadavg()[0]:.1f})")
    print(f"expected block-stack speedup: attention only {expected['attention_only']:.2f}x, "
          f"FLOP model {expected['flop_model']:.2f}x; at the paper's scale (L={PAPER['L']}, D={PAPER['dim']}): "
          f"{paper['attention_only']:.2f}x / {paper['flop_model']:.2f}x (paper measured {PAPER['measured']}x)")
    print_table(results, CALL_COLUMNS)
    if args.json:
        config = {"L": seq, "dim": args.dim, "depth": DEPTH, "heads": HEADS, "split": SPLIT, "keep_ratio": KEEP,
                  "img": img, "bf16": args.bf16, "batch": batch, "steps": args.steps, "modes": args.modes,
                  "device": where, "torch": torch.__version__}
        with open(args.json, "w") as f:
            json.dump({"config": config, "expected": expected, "expected_paper_scale": paper, "results": results},
                      f, indent=2)


if __name__ == "__main__":
    main()
