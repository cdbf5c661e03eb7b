"""Memory measurement of a training step: activation bytes saved for backward, the device's peak memory."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


class SavedActivationMeter:
    """Bytes saved for backward during a forward pass (device-independent activation memory).

    Counts each storage once, so views of one tensor are not double counted; parameters saved by
    linear layers are excluded because they are not activations.
    """

    def __init__(self, exclude: set[int] | None = None):
        self.bytes = 0
        self._seen: set[int] = set()
        self._exclude = exclude or set()

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        try:
            ptr = t.untyped_storage().data_ptr()
        except Exception:
            return t
        if ptr not in self._seen and ptr not in self._exclude:
            self._seen.add(ptr)
            self.bytes += t.untyped_storage().nbytes()
        return t

    @contextlib.contextmanager
    def measure(self) -> Iterator[SavedActivationMeter]:
        with torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t):
            yield self

    @staticmethod
    def parameter_pointers(model: torch.nn.Module) -> set[int]:
        out = set()
        for p in model.parameters():
            try:
                out.add(p.untyped_storage().data_ptr())
            except Exception:
                continue
        return out


def peak_memory_bytes(device: torch.device) -> int | None:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return None


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
