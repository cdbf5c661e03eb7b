"""What bench_sparse.py and bench_edm.py share: one training step of a module (eager, compiled or captured), timed,
FLOP-counted, profiled."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch
import torch.nn as nn
from torch.profiler import ProfilerActivity
from torch.profiler import profile as torch_profile
from torch.utils import flop_counter

from wxray.models.compiled import COMPILE_MODES, compile_module
from wxray.platform.cluster.devices import compute
from wxray.platform.train.step_graph import WARMUP_STEPS, StepGraph, capturable_adamw


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


MODES = ("eager", *COMPILE_MODES[1:], "captured")  # torch.compile's modes; captured = the whole step as a CUDA graph


class StepBench:
    """A module, AdamW and a loss closure loss_fn(module, generator); `probe()` counts FLOPs and saved bytes, `step()`
    times a step. With bf16 the closure runs as the training loops run a forward (`devices.compute`:
    bf16 autocast on the device's best attention kernels); parameters and optimizer stay fp32.

    `mode`: "eager", a torch.compile mode (models/compiled.py) or "captured" (the training loop's StepGraph: forward,
    backward and AdamW replayed as one CUDA graph). `warm_up()` runs the steps a mode needs before it is steady
    (compilation, CUDA-graph recording) and times them together: `warmup_s`, reported apart from the steps."""

    def __init__(self, module: nn.Module, loss_fn: Callable[[nn.Module, torch.Generator], torch.Tensor],
                 device: torch.device, seed: int, bf16: bool = False, mode: str = "eager"):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        if mode == "captured" and device.type != "cuda":
            raise ValueError("mode=captured needs a CUDA device")
        self.eager = module.to(device).train()
        self.module = self.eager if mode in ("eager", "captured") else compile_module(self.eager, mode, device)
        self.mode, self.amp = mode, lambda: compute(device, torch.bfloat16 if bf16 else None)
        params = list(module.parameters())
        self.opt = capturable_adamw(params, 1e-4, device) if mode == "captured" else torch.optim.AdamW(params, lr=1e-4)
        self.gen = torch.Generator(device=device).manual_seed(seed)
        self.graph = StepGraph(self._step, self.opt, device, say=lambda line: None) if mode == "captured" else None
        if self.graph is not None:
            self.graph.reseed(seed)
        self.loss_fn, self.device = loss_fn, device
        self.times: list[float] = []
        self.warmup_s = 0.0

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def probe(self) -> dict[str, float]:
        """A warm-up step of the eager module under FlopCounterMode (fwd + bwd FLOPs) and saved_tensors_hooks
        (forward only): the same counts whatever the mode."""
        saved = 0

        def pack(t: torch.Tensor) -> torch.Tensor:
            nonlocal saved
            saved += t.numel() * t.element_size()
            return t

        with flop_counter.FlopCounterMode(display=False, custom_mapping=_sdpa_cpu_flops()) as counter:
            self.opt.zero_grad(set_to_none=True)
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), self.amp():
                loss = self.loss_fn(self.eager, self.gen)
            loss.backward()
            self.opt.step()
        return {"GFLOP": counter.get_total_flops() / 1e9, "saved_MiB": saved / 2**20}

    def _step(self, batch: dict, w: torch.Tensor, gen: torch.Generator):
        with self.amp():
            loss = self.loss_fn(self.module, gen) * w
        loss.backward()
        self.opt.step()
        return loss.detach(), None

    def warm_up(self) -> None:
        """Eager: one step. Compiled or captured: the steps until replays are steady (compile or capture, and
        the CUDA-graph recordings of reduce-overhead); `warmup_s` is their wall time."""
        t0 = time.perf_counter()
        for _ in range(1 if self.mode == "eager" else WARMUP_STEPS + 2):
            self.step()
        self.warmup_s = time.perf_counter() - t0
        self.times.clear()

    def step(self) -> None:
        self.sync()
        t0 = time.perf_counter()
        if self.graph is not None:
            self.graph({}, 1.0)
        else:
            self.opt.zero_grad(set_to_none=True)
            self._step({}, 1.0, self.gen)
        self.sync()
        self.times.append(time.perf_counter() - t0)


def profile(bench: StepBench, name: str, steps: int = 3, rows: int = 12) -> None:
    """Where a step's time goes: torch.profiler's top ops by self device time (CPU time off GPUs)."""
    cuda = bench.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch_profile(activities=activities) as prof:
        for _ in range(steps):
            bench.step()
    del bench.times[-steps:]
    print(f"--- profile: {name}, {steps} steps")
    print(prof.key_averages().table(sort_by="self_cuda_time_total" if cuda else "self_cpu_time_total",
                                    row_limit=rows, max_name_column_width=48))


Column = tuple[str, int, Callable[[dict], str]]  # title, width, the cell of one result row


def print_table(results: dict[str, dict[str, dict]], extra: Sequence[Column] = ()) -> None:
    """One row per (variant, part) of `results`: time, FLOP and saved-memory ratios, the mode's ratio, warm-up
    time, then the `extra` columns of a benchmark."""
    header = (
        f"{'variant':8} {'part':22} {'step_ms':>9} {'min_ms':>9} {'speedup':>8} {'min_x':>6} "
        f"{'GFLOP':>8} {'flop_x':>7} {'saved_MiB':>10} {'mem_x':>6} {'mode_x':>7} {'warmup_s':>9}"
        + "".join(f" {title:>{width}}" for title, width, _ in extra)
    )
    print(header)
    print("-" * len(header))
    for variant, parts in results.items():
        for part, r in parts.items():
            print(
                f"{variant:8} {part:22} {r['step_ms']:9.1f} {r['min_ms']:9.1f} "
                f"{r['speedup']:7.2f}x {r['speedup_min']:5.2f}x "
                f"{r['GFLOP']:8.1f} {r['flop_speedup']:6.2f}x "
                f"{r['saved_MiB']:10.1f} {r['saved_reduction']:5.2f}x {r['mode_speedup']:6.2f}x {r['warmup_s']:9.1f}"
                + "".join(f" {cell(r):>{width}}" for _, width, cell in extra)
            )
