"""What bench_sparse.py and bench_edm.py share: one training step of a module, timed, FLOP-counted, profiled."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.nn as nn
from torch.utils import flop_counter

from wxray.platform.cluster.devices import compute


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


class StepBench:
    """A module, AdamW and a loss closure loss_fn(generator); `probe()` counts FLOPs and saved bytes, `step()`
    times a step. With bf16 the closure runs as the training loops run a forward (`devices.compute`:
    bf16 autocast on the device's best attention kernels); parameters and optimizer stay fp32."""

    def __init__(self, module: nn.Module, loss_fn: Callable[[torch.Generator], torch.Tensor],
                 device: torch.device, seed: int, bf16: bool = False):
        self.module = module.to(device).train()
        self.amp = lambda: compute(device, torch.bfloat16 if bf16 else None)
        self.opt = torch.optim.AdamW(module.parameters(), lr=1e-4)
        self.gen = torch.Generator(device=device).manual_seed(seed)
        self.loss_fn, self.device = loss_fn, device
        self.times: list[float] = []

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

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
                loss = self.loss_fn(self.gen)
            loss.backward()
            self.opt.step()
        return {"GFLOP": counter.get_total_flops() / 1e9, "saved_MiB": saved / 2**20}

    def step(self) -> None:
        self.sync()
        t0 = time.perf_counter()
        self.opt.zero_grad(set_to_none=True)
        with self.amp():
            loss = self.loss_fn(self.gen)
        loss.backward()
        self.opt.step()
        self.sync()
        self.times.append(time.perf_counter() - t0)


def profile(bench: StepBench, name: str, steps: int = 3, rows: int = 12) -> None:
    """Where a step's time goes: torch.profiler's top ops by self device time (CPU time off GPUs)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    cuda = bench.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch_profile(activities=activities) as prof:
        for _ in range(steps):
            bench.step()
    del bench.times[-steps:]
    print(f"--- profile: {name}, {steps} steps")
    print(prof.key_averages().table(sort_by="self_cuda_time_total" if cuda else "self_cpu_time_total",
                                    row_limit=rows, max_name_column_width=48))
