"""Device handling in one place: Ray resources, worker devices, ROCm visibility, precision, attention kernels.

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

from wxray.config import PosFloat, PosInt
from wxray.errors import ConfigError
from wxray.job import say, verbose

Vendor = Literal["nvidia", "amd", "any"]


@dataclass
class ScalingCfg:
    # Ray Train workers (one process group; FSDP2 shards across them). [min, max]: elastic, the run starts once
    # min fit and resizes (from its latest checkpoint) as workers are lost or free up; needs train.max_failures.
    num_workers: PosInt | tuple[PosInt, PosInt] = 1
    use_gpu: bool = False  # scaling.gpus_per_worker GPUs per worker (NVIDIA or AMD ROCm)
    cpus_per_worker: PosFloat = 1.0  # CPUs reserved per worker (also its torch threads on CPU)
    accelerator_type: str = ""  # e.g. "H100", "A100", "AMD-Instinct-MI250X"; "" = any
    # GPU vendor of every worker (one process group never mixes NCCL and RCCL); any: at start, the vendor with
    # enough GPUs and the most free (the run's config then records it). Nodes name theirs by the wxray.io/vendor
    # label or the nvidia/amd resource (cluster.yaml, cluster/slurm).
    vendor: Vendor = "any"
    gpus_per_worker: PosInt = 1  # GPUs reserved per worker (the loop trains on the first)
    resize_interval_s: PosFloat = 60.0  # elastic runs: how often a healthy run looks for room to grow

    @property
    def elastic(self) -> bool:
        return isinstance(self.num_workers, (tuple, list))

    @property
    def min_workers(self) -> int:
        return int(self.num_workers[0]) if self.elastic else int(self.num_workers)

    @property
    def max_workers(self) -> int:
        return int(self.num_workers[1]) if self.elastic else int(self.num_workers)

    def describe(self) -> str:
        return f"{self.min_workers}-{self.max_workers} workers (elastic)" if self.elastic else \
            f"{self.num_workers} worker(s)"

    def validate(self) -> None:
        if self.elastic:
            self.num_workers = tuple(self.num_workers)
            if self.min_workers > self.max_workers:
                raise ConfigError(f"scaling.num_workers={list(self.num_workers)}: expected [min, max] with "
                                  f"min <= max")
        if not self.use_gpu:
            for key, default in (("accelerator_type", ""), ("vendor", "any"), ("gpus_per_worker", 1)):
                if getattr(self, key) != default:
                    raise ConfigError(f"scaling.{key} is set but scaling.use_gpu=false")
        amd_type = self.accelerator_type.startswith("AMD-")
        if self.accelerator_type and self.vendor != "any" and amd_type != (self.vendor == "amd"):
            raise ConfigError(f"scaling.accelerator_type={self.accelerator_type!r} is "
                              f"{'an AMD' if amd_type else 'not an AMD'} type but scaling.vendor={self.vendor}")


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
    """Ray Train's ScalingConfig; a GPU run with a vendor is pinned to its nodes (label selector or resource)."""
    from ray.train import ScalingConfig

    kwargs: dict = {"num_workers": cfg.num_workers, "use_gpu": cfg.use_gpu,
                    "resources_per_worker": {"CPU": cfg.cpus_per_worker}}
    if cfg.elastic:
        kwargs.update(num_workers=(cfg.min_workers, cfg.max_workers),
                      elastic_resize_monitor_interval_s=cfg.resize_interval_s)
    if cfg.use_gpu:
        kwargs["resources_per_worker"]["GPU"] = cfg.gpus_per_worker
        if cfg.accelerator_type:
            kwargs["accelerator_type"] = cfg.accelerator_type
        if cfg.vendor != "any":
            from wxray.platform import placement

            pin = placement.pin_for(cfg.vendor, placement.cluster_nodes(), cfg.accelerator_type)
            kwargs["resources_per_worker"].update(pin.resources(cfg.gpus_per_worker))
            if pin.label_selector:
                kwargs["label_selector"] = dict(pin.label_selector)
    return ScalingConfig(**kwargs)


def torch_config(cfg: ScalingCfg):
    """TorchTrainer's `torch_config`: None (Ray's default) except for GPU runs that may land on AMD nodes,
    which get the ROCm device fix (`placement.RocmTorchConfig`, see `select_local_device`)."""
    if not cfg.use_gpu or cfg.vendor == "nvidia":
        return None
    from wxray.platform.placement import RocmTorchConfig

    return RocmTorchConfig()


def check_cluster_fits(cfg: ScalingCfg, reserve_cpus: float = 0.0):
    """Fail fast with one line when the cluster cannot hold the workers (Ray would wait forever).

    A GPU run also gets its vendor here (`placement.resolve`): `scaling.vendor=any` becomes the vendor
    chosen, so the ScalingConfig built later pins the workers to the same nodes. Returns the Placement.
    """
    import ray

    from wxray.platform import placement

    total = ray.cluster_resources()
    need_cpu = cfg.min_workers * cfg.cpus_per_worker + reserve_cpus  # an elastic run starts at its minimum
    if total.get("CPU", 0) < need_cpu:
        raise ConfigError(
            f"scaling.num_workers={cfg.min_workers} x scaling.cpus_per_worker={cfg.cpus_per_worker} "
            f"(+{reserve_cpus} for data reads) needs {need_cpu:g} CPUs; the Ray cluster has {total.get('CPU', 0):g}")
    if not cfg.use_gpu:
        return placement.Placement()
    found = placement.resolve(cfg, placement.cluster_nodes())
    if found.vendor and cfg.vendor == "any":
        cfg.vendor = found.vendor
        say(found.reason)
    return found


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
    NVIDIA and CPU); returns the worker's cuda index. Run by `placement.RocmTorchConfig` on every worker."""
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
    from torch.nn.attention import SDPBackend

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
    from torch.nn.attention import sdpa_kernel

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


# Memory measurement lives in memory.py; these names stay reachable as accelerators.* for the loops and tests.
from wxray.platform.memory import SavedActivationMeter, peak_memory_bytes, reset_peak_memory  # noqa: E402,F401
