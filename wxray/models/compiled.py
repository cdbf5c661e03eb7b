"""torch.compile for every model of the platform: one mode key for training and inference, one fallback line.

Modes are torch.compile's: "default" (Inductor kernels: fused element-wise ops, fewer launches),
"reduce-overhead" (the same kernels replayed as CUDA graphs, which removes the host's per-kernel launch cost that
bounds small steps, BENCHMARKS.md 7a), "max-autotune" (autotuned matrix products, CUDA graphs too) and
"max-autotune-no-cudagraphs"; "off" keeps eager PyTorch.

What compiles: everything between two random draws. A draw from an explicit torch.Generator (token routing, MC
dropout masks, EDM noise) cannot be traced by Dynamo, so each one is a graph break: it runs eagerly, from the same
generator, giving the same numbers as eager PyTorch, and the ops around it run as compiled graphs. The sparse
stage's gather/scatter has data-dependent indices but a fixed count K = floor(r L), so its shapes are static and it
compiles (and captures) like a dense op. Host read-backs (value checks) are skipped while compiling or capturing
(`host_checks`), where they would be a graph break or an illegal synchronisation.

On a device without CUDA the CUDA-graph modes fall back to their twin without graphs, and say so in one line.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
import torch.nn as nn

CompileMode = Literal["off", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
COMPILE_MODES: tuple[str, ...] = CompileMode.__args__
# inductor generates the kernels; aot_eager traces and differentiates the graphs without generating code (a quick
# check that a model compiles, seconds where Inductor takes a minute on a CPU); the mode applies to inductor only
CompileBackend = Literal["inductor", "aot_eager"]
_NO_GRAPHS = {"reduce-overhead": "default", "max-autotune": "max-autotune-no-cudagraphs"}


def compile_mode(mode: CompileMode | bool) -> str:
    """A compile key's value as a torch.compile mode or "off" (true = "default", false = "off": the key's older
    boolean form)."""
    if mode is True:
        return "default"
    if mode is False or mode is None:
        return "off"
    if mode not in COMPILE_MODES:
        raise ValueError(f"compile mode must be one of {', '.join(COMPILE_MODES)}, got {mode!r}")
    return mode


def mode_for(mode: CompileMode | bool, device: torch.device | str) -> tuple[str, str | None]:
    """(the mode to use on `device`, the one line to print when it differs from the asked one, else None)."""
    mode = compile_mode(mode)
    if mode in _NO_GRAPHS and torch.device(device).type != "cuda":
        twin = _NO_GRAPHS[mode]
        return twin, f"compile={mode}: CUDA graphs need a CUDA device, compiling with mode={twin} on {device}"
    return mode, None


def compile_module(module: nn.Module, mode: CompileMode | bool, device: torch.device | str = "cpu",
                   backend: CompileBackend | Callable = "inductor", say=print) -> nn.Module:
    """`module` compiled with `mode` for `device` (itself when mode is "off"). The module's attributes stay reachable
    through the wrapper (torch's OptimizedModule forwards them), so tasks and rollouts need no special case."""
    mode, note = mode_for(mode, device)
    if mode == "off":
        return module
    if note:
        say(note)
    say(f"compile: torch.compile of {_model_name(module)}, backend={backend}"
        + (f", mode={mode}" if backend == "inductor" else "") + " (compiles at its first call)")
    if backend != "inductor":
        return torch.compile(module, backend=backend)
    return torch.compile(module, mode=mode)


def _model_name(module: nn.Module) -> str:
    """The model's own class name: FSDP2's fully_shard swaps a module's class for a generated FSDP<Name> subclass,
    a name the user never wrote."""
    return next(c.__name__ for c in type(module).__mro__ if not c.__name__.startswith("FSDP"))


def compile_forecaster(model: nn.Module, mode: CompileMode | bool, device: torch.device | str = "cpu",
                       backend: CompileBackend | Callable = "inductor", say=print) -> nn.Module:
    """A forecaster for rollouts, compiled: a generative one (EDMForecaster) compiles its denoiser, so the sampler's
    loop stays Python and each of its 2N - 1 calls is one compiled call (CUDA graphs with reduce-overhead);
    any other compiles whole."""
    if getattr(model, "generative", False) and hasattr(model, "denoiser"):
        if compile_mode(mode) != "off":
            model.denoiser = compile_module(model.denoiser, mode, device, backend, say)
        return model
    return compile_module(model, mode, device, backend, say)


def host_checks(t: torch.Tensor) -> bool:
    """Whether a value check may read `t` back to the host here: not while Dynamo traces, nor while a CUDA graph is
    being captured (a read-back is then a graph break, or an error that ends the capture)."""
    if torch.compiler.is_compiling():
        return False
    return not (t.is_cuda and torch.cuda.is_current_stream_capturing())
