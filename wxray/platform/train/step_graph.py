"""`train.cuda_graphs`: the whole training step (forward, backward, clip, AdamW) captured once as a CUDA graph.

    replay:  copy the batch into static buffers -> graph.replay() -> read the static loss

A small step is bound by the host, which launches hundreds of kernels one by one (BENCHMARKS.md 7a: 16 ms of GPU
kernels inside 22-30 ms of wall time at L = 2048, batch 8); a replay launches them all at once. What capture needs,
and how this provides it:

- static shapes: the first batch's shape is warmed up, captured and replayed; a batch of another shape (an epoch's
  last, smaller one) runs eagerly, on the same parameters, gradients and optimizer state, after one line;
- no host work inside the step: the learning rate and the batch weight are device tensors (AdamW with
  `capturable=True` and a tensor lr), value checks are skipped while capturing (`models.compiled.host_checks`);
- random draws on the device: routing keys and dropout masks come from a CUDA generator registered with the graph,
  so every replay draws new numbers (reseeded each epoch, as the eager loop reseeds its CPU generator; the two
  modes therefore draw different, equally distributed numbers);
- warm-up on a side stream (cuBLAS workspaces, autograd's streams), then capture with gradients set to None, so
  the graph's backward writes them afresh on every replay.

Where a step cannot be captured (no CUDA device, several workers whose gradient collectives run outside the
step, activation checkpointing, which copies generator states on the host, or a capture that fails) the steps run
eagerly, after one line that says why.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

StepFn = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]  # step(batch, w, generator)
WARMUP_STEPS = 3  # eager steps on a side stream before the capture (the PyTorch CUDA-graph recipe's count)


def why_not_captured(device: torch.device, world: int, activation_checkpointing: bool) -> str | None:
    """Why the steps of this run cannot be captured, or None when they can (before anything is built)."""
    if device.type != "cuda":
        return f"CUDA graphs need a CUDA device, the steps run uncaptured on {device.type}"
    if world > 1:
        return f"the gradient collectives of {world} workers are not captured: the steps run uncaptured"
    if activation_checkpointing:
        return "activation checkpointing copies generator states on the host: the steps run uncaptured"
    return None


def capturable_adamw(params, lr: float, device: torch.device, **kwargs) -> torch.optim.AdamW:
    """AdamW whose step runs without host work: its step counts and learning rate live on `device`."""
    return torch.optim.AdamW(params, lr=torch.tensor(lr, device=device), capturable=True, **kwargs)


def match_capture(opt: torch.optim.Optimizer, capturable: bool, device: torch.device) -> None:
    """After loading a checkpoint's optimizer state: this run's capture settings, not the writer's. A checkpoint
    brings its run's `capturable` flag and lr (a float, or a tensor now on the CPU, which a captured AdamW would
    read once at capture and freeze), and step counts where that run kept them."""
    for group in opt.param_groups:
        lr = float(group["lr"])
        group["lr"] = torch.tensor(lr, device=device) if capturable else lr
        group["capturable"] = capturable
    for state in opt.state.values():
        if torch.is_tensor(state.get("step")):
            state["step"] = state["step"].to(device=device if capturable else "cpu", dtype=torch.float32)


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    """The learning rate of every group: written into the device tensor where the optimizer is capturable."""
    for group in opt.param_groups:
        if torch.is_tensor(group["lr"]):
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr


class StepGraph:
    """`step(batch, w, generator)` (no zero_grad: the graph's backward assigns the gradients) warmed up, captured
    on the first batch after the warm-up and replayed for every batch of that shape."""

    def __init__(self, step: StepFn, opt: torch.optim.Optimizer, device: torch.device, say=print):
        self.step, self.opt, self.device, self.say = step, opt, device, say
        self.graph = torch.cuda.CUDAGraph()
        self.generator = torch.Generator(device=device)
        register = getattr(self.graph, "register_generator_state", None)
        if register is None:  # an older torch: only the device's default generator is graph-safe
            self.generator = torch.cuda.default_generators[device.index or 0]
        else:
            register(self.generator)
        self.warm, self.captured, self.failed, self.told = 0, False, False, False
        self.shape: dict[str, tuple] = {}
        self.static: dict[str, torch.Tensor] = {}
        self.weight = torch.zeros((), device=device)
        self.out: tuple[torch.Tensor, torch.Tensor | None] | None = None

    def reseed(self, seed: int) -> None:
        self.generator.manual_seed(seed)

    def __call__(self, batch: dict, w: float) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The step on `batch` with loss weight `w`: (loss, auxiliary loss or None), replayed where it can be."""
        if self.failed:
            return self._eager(batch, w)
        shape = {k: (tuple(v.shape), v.dtype) for k, v in batch.items() if torch.is_tensor(v)}
        self.shape = self.shape or shape  # the first batch's, normally the full one: the shape to capture
        if shape != self.shape:
            if not self.told:
                self.told = True
                self.say(f"train.cuda_graphs: batches of another shape than the first (x {shape['x'][0]}, not "
                         f"{self.shape['x'][0]}) run uncaptured")
            return self._eager(batch, w)
        if self.warm < WARMUP_STEPS:
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                out = self._eager(batch, w)
            torch.cuda.current_stream(self.device).wait_stream(side)
            self.warm += 1
            return out
        if not self.captured:
            return self._capture(batch, w)
        self._load(batch, w)
        self.graph.replay()
        return self.out

    def _load(self, batch: dict, w: float) -> None:
        for k, v in self.static.items():
            v.copy_(batch[k], non_blocking=True)
        self.weight.fill_(w)

    def _eager(self, batch: dict, w: float) -> tuple[torch.Tensor, torch.Tensor | None]:
        # once captured, the gradients are the graph's own tensors: zeroed in place, never replaced
        self.opt.zero_grad(set_to_none=not self.captured)
        return self.step(batch, torch.full((), float(w), device=self.device), self.generator)

    def _capture(self, batch: dict, w: float) -> tuple[torch.Tensor, torch.Tensor | None]:
        self.static = {k: v.detach().clone() for k, v in batch.items() if torch.is_tensor(v)}
        self.weight.fill_(w)
        self.opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize(self.device)
        try:
            # thread_local: Ray's and MLflow's threads in this process may touch CUDA while the step is captured
            with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
                self.out = self.step(self.static, self.weight, self.generator)
        except Exception as e:  # noqa: BLE001 - any failure to capture means: run eagerly, and say why
            self.failed = True
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            self.say(f"train.cuda_graphs: the step could not be captured ({reason[:160]}): the steps run uncaptured")
            torch.cuda.synchronize(self.device)
            return self._eager(batch, w)
        self.captured = True
        self.say("train.cuda_graphs: the training step is captured; batches of its shape replay it")
        self.graph.replay()
        return self.out
