"""Devices in one place: a worker's device, ROCm visibility, precision, attention kernels.

NVIDIA and AMD GPUs both appear to Ray as ``GPU`` (AMD with accelerator types such as
``AMD-Instinct-MI250X``; Ray sets ``HIP_VISIBLE_DEVICES``) and to PyTorch as ``cuda`` devices (ROCm
builds), so one code path serves both. Which vendor's nodes a run uses is `placement.py`'s business.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from wxray.errors import ConfigError


def worker_device() -> torch.device:
    """This Train worker's device (cuda:i for NVIDIA and ROCm, else cpu)."""
    try:
        import ray.train.torch

        return ray.train.torch.get_device()
    except Exception:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")


# --- ROCm device visibility --------------------------------------------------------------------------------
# Ray sets HIP_VISIBLE_DEVICES=<the worker's own GPU> on AMD workers, while Ray Train V2 shares only
# CUDA_VISIBLE_DEVICES=<every GPU of the node's workers> and asks for cuda:<position in that list>. ROCm reads
# HIP_VISIBLE_DEVICES first, so with several workers per node that device does not exist ("invalid device
# ordinal", ray-project/ray#49260). The fix makes HIP see the shared list too, before torch touches the GPU.
# HIP ids count within ROCR_VISIBLE_DEVICES when that is set (Slurm sets it).

ROCM_RUNTIME_ENV: dict[str, Any] = {"env_vars": {"RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES": "1"}}
"""Runtime env recommended for AMD runs (`ray job submit --runtime-env-json`): Ray then leaves
HIP_VISIBLE_DEVICES alone, so nothing but the shared list decides a worker's GPUs."""


@dataclass(frozen=True)
class LocalDevice:
    index: int  # cuda:<index> in this process once `env` is applied
    env: dict[str, str] = field(default_factory=dict)  # set these before the first torch.cuda call


def _visible(value: str | None) -> list[str] | None:
    if value is None:
        return None
    return [] if value.strip() in ("", "NoDevFiles") else [v.strip() for v in value.split(",")]


def select_local_device(environ: Mapping[str, str], local_rank: int, local_world_size: int,
                        gpu_ids: Sequence[str] | None = None, hip: bool | None = None) -> LocalDevice:
    """This worker's cuda index, and on ROCm the visibility variables that make it valid.

    `environ`: the worker's environment as Ray left it; `gpu_ids`: `ray.get_gpu_ids()` (without them the
    local rank picks the worker's share of the node's list, as Train V2 orders workers by GPU id);
    `hip`: ROCm torch (default: `torch.version.hip`). ConfigError when the variables cannot be reconciled.
    """
    hip = bool(torch.version.hip) if hip is None else hip
    if local_world_size < 1 or not 0 <= local_rank < local_world_size:
        raise ConfigError(f"local rank {local_rank} of {local_world_size} worker(s) on this node is not a rank")
    shown = {k: _visible(environ.get(k)) for k in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
                                                   "ROCR_VISIBLE_DEVICES")}
    # Train V2's shared list is CUDA_VISIBLE_DEVICES; on ROCm, HIP_VISIBLE_DEVICES stands in when that is unset
    use_hip = hip and not shown["CUDA_VISIBLE_DEVICES"] and shown["HIP_VISIBLE_DEVICES"] is not None
    name = "HIP_VISIBLE_DEVICES" if use_hip else "CUDA_VISIBLE_DEVICES"
    shared, rocr = shown[name], shown["ROCR_VISIBLE_DEVICES"]
    if shared == []:
        raise ConfigError(f"{name}={environ.get(name)!r} hides every GPU from local rank {local_rank}")
    if shared is None:  # nothing restricts visibility: Ray's ids are device indices (within ROCR's list)
        own = [str(i) for i in gpu_ids] if gpu_ids else [str(local_rank)]
        if hip:
            _check_rocr(own, rocr)
        if not own[0].isdigit():
            raise ConfigError(f"GPU {own[0]} of local rank {local_rank} is no index and {name} is not set")
        return LocalDevice(int(own[0]))
    if gpu_ids:
        own = [str(i) for i in gpu_ids]
    elif len(shared) % local_world_size:
        raise ConfigError(f"{name}={','.join(shared)} lists {len(shared)} GPUs for {local_world_size} workers on "
                          f"this node: local rank {local_rank}'s share is ambiguous")
    else:
        per = len(shared) // local_world_size
        own = shared[local_rank * per:(local_rank + 1) * per]
    missing = [i for i in own if i not in shared]
    if missing:
        raise ConfigError(f"GPU {','.join(missing)} that Ray gave local rank {local_rank} is not in "
                          f"{name}={','.join(shared)} (Ray Train lists the node's workers' GPUs there)")
    index = shared.index(own[0])
    if not hip:
        return LocalDevice(index)
    _check_rocr(shared, rocr)
    value = ",".join(shared)
    return LocalDevice(index, {k: value for k in ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
                               if environ.get(k) != value})


def _check_rocr(ids: list[str], rocr: list[str] | None) -> None:
    bad = [i for i in ids if not i.isdigit() or int(i) >= len(rocr)] if rocr is not None else []
    if bad:
        raise ConfigError(f"GPU id(s) {','.join(bad)} do not fit ROCR_VISIBLE_DEVICES={','.join(rocr or [])}: HIP "
                          f"ids count within its {len(rocr or [])} GPU(s); start Ray there with HIP_VISIBLE_DEVICES="
                          f"{','.join(map(str, range(len(rocr or []))))} (cluster/slurm/ray_cluster.sbatch does)")


def apply_rocm_worker_env() -> int:
    """On a Ray Train worker, before torch touches the GPU: make ROCm see the node's shared GPU list (no-op on
    NVIDIA and CPU); returns the worker's cuda index. Run on every worker by the backend of
    `placement.rocm_torch_config_cls()`."""
    import ray
    import ray.train

    ids = [str(i) for i in ray.get_gpu_ids()]
    if not torch.version.hip or not ids:
        return 0
    ctx = ray.train.get_context()
    dev = select_local_device(os.environ, ctx.get_local_rank(), ctx.get_local_world_size(), ids)
    os.environ.update(dev.env)
    return dev.index


def set_cpu_threads(cpus: float) -> None:
    # Without this every worker starts one thread per core and they fight over the machine.
    torch.set_num_threads(max(1, math.floor(cpus)))


Precision = Literal["auto", "bf16", "fp32"]


def autocast_dtype(precision: Precision, device: torch.device) -> torch.dtype | None:
    """bf16 autocast where the device supports it ("auto": GPUs with bf16; CPUs stay fp32 for speed)."""
    if precision == "fp32":
        return None
    if device.type == "cuda":
        return torch.bfloat16 if bf16_supported(device) else None
    return torch.bfloat16 if precision == "bf16" else None


# gfx908 MI100, gfx90a MI200 (MI250X), gfx94x MI300, gfx95x MI350, gfx11/gfx12 Radeon: bf16 in hardware.
ROCM_BF16_ARCHS = ("gfx908", "gfx90a", "gfx94", "gfx95", "gfx11", "gfx12")
# Archs with PyTorch's ROCm flash / memory-efficient SDPA kernels (AOTriton), not behind an experimental flag.
ROCM_FLASH_ARCHS = ("gfx90a", "gfx942", "gfx950")


def _gpu(device: torch.device, props: Any, hip: bool | None) -> tuple[Any, bool]:
    props = props if props is not None else torch.cuda.get_device_properties(device)
    return props, bool(torch.version.hip) if hip is None else hip


def bf16_supported(device: torch.device, props: Any = None, hip: bool | None = None) -> bool:
    """bf16 in hardware: NVIDIA sm80+ (A100, H100), AMD CDNA2+ (MI250X) per `ROCM_BF16_ARCHS`; CPUs compute it
    too (slowly without AVX512-BF16/AMX: precision=auto keeps them fp32). `props`/`hip` fake a device in tests.
    Unlike torch.cuda.is_bf16_supported() an emulated bf16 (V100) counts as unsupported."""
    if device.type == "cpu":
        return True
    if device.type != "cuda":
        return False
    props, hip = _gpu(device, props, hip)
    if hip:
        return str(getattr(props, "gcnArchName", "")).startswith(ROCM_BF16_ARCHS)
    return props.major >= 8


def sdpa_backends(device: torch.device, props: Any = None, hip: bool | None = None,
                  flash_built: bool | None = None) -> list | None:
    """Scaled-dot-product-attention kernels for `device`, best first, for
    `torch.nn.attention.sdpa_kernel(backends, set_priority=True)` (torch falls back along the list when a
    kernel cannot take the inputs, e.g. flash with fp32): flash on NVIDIA sm80+; on AMD the AOTriton
    flash / memory-efficient kernels on `ROCM_FLASH_ARCHS`; memory-efficient on older NVIDIA; math on other
    GPUs. None off GPUs: torch's own choice (its CPU flash kernel) is the best there.
    `flash_built`: whether this torch has the flash kernels (default: asks torch)."""
    if device.type != "cuda":
        return None
    props, hip = _gpu(device, props, hip)
    flash = torch.backends.cuda.is_flash_attention_available() if flash_built is None else flash_built
    fast = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    if hip:
        return fast if flash and str(getattr(props, "gcnArchName", "")).startswith(ROCM_FLASH_ARCHS) \
            else [SDPBackend.MATH]
    return fast if flash and props.major >= 8 else [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def sdpa_context(device: torch.device):
    """`with sdpa_context(device):` runs scaled_dot_product_attention on `sdpa_backends(device)`."""
    backends = sdpa_backends(device)
    return contextlib.nullcontext() if backends is None else sdpa_kernel(backends, set_priority=True)


def autocast(device: torch.device, dtype: torch.dtype | None):
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


@contextlib.contextmanager
def compute(device: torch.device, dtype: torch.dtype | None) -> Iterator[None]:
    """How the training loops run forwards: autocast to `dtype` on the device's best attention kernels."""
    with autocast(device, dtype), sdpa_context(device):
        yield
