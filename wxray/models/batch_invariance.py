"""Forward passes whose every sample gets the same bits whatever the batch it is in, on the CPU.

A member of an ensemble is recomputable alone (its draws derive from its coordinates, `forecast/seeds.py`), but
only bit for bit if the arithmetic of its sample does not depend on the batch around it. On the CPU, oneDNN
(mkldnn) picks its convolution and matmul algorithms by the batch size, so a sample computed in a batch of 8
differs from itself alone by float32 rounding (1e-7 relative, measured on the demo model). And from a batch of 16
on, a convolution goes to NNPACK, whose tiling also depends on the batch (1e-6 at 16 members, measured by
benchmarks/bench_rollout.py). PyTorch's native CPU kernels compute each sample the same way whatever the batch:
within `batch_invariant(device)` oneDNN and NNPACK are off, so batched members are bit-identical to members
computed one at a time (`tests/forecast/test_rollout.py`).

On CUDA, cuBLAS and cuDNN choose kernels by shape too and offer no such switch: there only batch_size=1
guarantees bit-identity (the context is then a no-op).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def batch_invariant(device: torch.device | str = "cpu") -> Iterator[None]:
    if torch.device(device).type != "cpu":
        yield
        return
    before = torch.backends.mkldnn.enabled  # (mkldnn.flags() would also warn about Intel-GPU TF32)
    torch.backends.mkldnn.enabled = False
    try:
        with torch.backends.nnpack.flags(enabled=False):
            yield
    finally:
        torch.backends.mkldnn.enabled = before
