"""Device handling in one place: Ray resources, worker devices, precision, peak-memory measurement.

NVIDIA and AMD GPUs both appear to Ray as ``GPU`` (AMD with accelerator types such as
``AMD-Instinct-MI250X``; Ray sets ``HIP_VISIBLE_DEVICES``) and to PyTorch as ``cuda`` devices (ROCm
builds), so one code path serves both.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import torch

from wxray.config import PosFloat, PosInt
from wxray.errors import ConfigError
from wxray.job import verbose


@dataclass
class ScalingCfg:
    num_workers: PosInt = 1  # Ray Train workers (one process group; FSDP2 shards across them)
    use_gpu: bool = False  # one GPU per worker (NVIDIA or AMD ROCm)
    cpus_per_worker: PosFloat = 1.0  # CPUs reserved per worker (also its torch threads on CPU)
    accelerator_type: str = ""  # e.g. "H100", "A100", "AMD-Instinct-MI250X"; "" = any

    def validate(self) -> None:
        if self.accelerator_type and not self.use_gpu:
            raise ConfigError("scaling.accelerator_type is set but scaling.use_gpu=false")


def _quiet_ray() -> None:
    """Keep Ray's own chatter off the console (the job prints its progress itself); --verbose restores it."""
    import logging

    for name in ("ray._private.authentication.authentication_token_setup", "ray.data", "ray.train",
                 "ray.tune"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _reachable(address: str, timeout_s: float) -> None:
    """ConfigError unless something listens at host:port within `timeout_s` (Ray itself retries forever)."""
    import socket
    import time

    target = address.split("://", 1)[-1]
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"ray_address={address!r}: expected host:port (e.g. 10.0.0.1:6379), ray://host:port, "
                          f"auto or local")
    host = host.strip("[]") or "127.0.0.1"  # [::1]:6379
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=min(5.0, timeout_s)):
                return
        except OSError as e:
            if time.monotonic() >= deadline:
                raise ConfigError(f"ray_address={address}: no Ray cluster answers there after {timeout_s:g} s "
                                  f"({e.strerror or type(e).__name__}); start one with `ray start --head` "
                                  f"or leave ray_address empty for a local cluster") from None
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


def ensure_ray(address: str = "", num_cpus: int | None = None, timeout_s: float = 60.0) -> None:
    """Connect to a running cluster (address, or RAY_ADDRESS under `ray job submit`) or start a local one.

    Jobs never assume they started Ray: inside `ray job submit` the driver joins the job's cluster. An
    explicit address is probed first, so an unreachable cluster is an error after `timeout_s`, not a hang.
    Worker logs reach the console only with --verbose ($WXRAY_VERBOSE): the job's progress lines travel
    through `reporting.ProgressPrinter` instead.
    """
    import ray

    if ray.is_initialized():
        return
    loud = verbose()
    if not loud:
        _quiet_ray()
    kwargs: dict = {"log_to_driver": loud, "configure_logging": loud}
    env_address = os.environ.get("RAY_ADDRESS", "")
    target = address or env_address
    if target not in ("", "auto", "local"):  # Ray's own keywords: nothing to probe
        _reachable(target, timeout_s)
    if address:
        ray.init(address=address, **kwargs)
    elif env_address:
        ray.init(**kwargs)
    else:
        # "local": a fresh cluster, never a stale or unrelated one found through /tmp/ray/ray_current_cluster.
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, **kwargs)


def ray_scaling_config(cfg: ScalingCfg):
    from ray.train import ScalingConfig

    kwargs: dict = {"num_workers": cfg.num_workers, "use_gpu": cfg.use_gpu,
                    "resources_per_worker": {"CPU": cfg.cpus_per_worker}}
    if cfg.use_gpu:
        kwargs["resources_per_worker"]["GPU"] = 1
        if cfg.accelerator_type:
            kwargs["accelerator_type"] = cfg.accelerator_type
    return ScalingConfig(**kwargs)


def check_cluster_fits(cfg: ScalingCfg, reserve_cpus: float = 0.0) -> None:
    """Fail fast with one line when the cluster cannot hold the workers (Ray would wait forever)."""
    import ray

    total = ray.cluster_resources()
    need_cpu = cfg.num_workers * cfg.cpus_per_worker + reserve_cpus
    if total.get("CPU", 0) < need_cpu:
        raise ConfigError(
            f"scaling.num_workers={cfg.num_workers} x scaling.cpus_per_worker={cfg.cpus_per_worker} "
            f"(+{reserve_cpus} for data reads) needs {need_cpu:g} CPUs; the Ray cluster has {total.get('CPU', 0):g}")
    if cfg.use_gpu:
        have = total.get("GPU", 0)
        if have < cfg.num_workers:
            raise ConfigError(f"scaling.num_workers={cfg.num_workers} with use_gpu=true needs "
                              f"{cfg.num_workers} GPUs; the Ray cluster has {have:g}")
        if cfg.accelerator_type:
            key = f"accelerator_type:{cfg.accelerator_type}"
            if total.get(key, 0) <= 0:
                kinds = sorted(k.split(":", 1)[1] for k in total if k.startswith("accelerator_type:"))
                raise ConfigError(f"scaling.accelerator_type={cfg.accelerator_type!r} is not in the cluster "
                                  f"(has: {', '.join(kinds) or 'none'})")


def worker_device() -> torch.device:
    """This Train worker's device (cuda:i for NVIDIA and ROCm, else cpu)."""
    try:
        import ray.train.torch

        return ray.train.torch.get_device()
    except Exception:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def set_cpu_threads(cpus: float) -> None:
    # Without this every worker starts one thread per core and they fight over the machine.
    torch.set_num_threads(max(1, math.floor(cpus)))


Precision = Literal["auto", "bf16", "fp32"]


def autocast_dtype(precision: Precision, device: torch.device) -> torch.dtype | None:
    """bf16 autocast where the device supports it ("auto": GPUs with bf16; CPUs stay fp32 for speed)."""
    if precision == "fp32":
        return None
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else None
    return torch.bfloat16 if precision == "bf16" else None


def autocast(device: torch.device, dtype: torch.dtype | None):
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


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
