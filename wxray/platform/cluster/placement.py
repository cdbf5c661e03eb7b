"""Vendor-aware placement: which GPU nodes a training run, a task or an actor may use.

A training run is one process group, so its workers never mix NVIDIA (NCCL) and AMD (RCCL) GPUs. A node names
its vendor by the `wxray.io/vendor` label (cluster.yaml, cluster/slurm/ray_cluster.sbatch), else by the vendor
resource `nvidia` / `amd` (one unit per GPU), else through the accelerator type Ray detected (`AMD-...` is AMD).
Workers are pinned the same way, the label first: Ray 2.60 takes label selectors in
`ScalingConfig(label_selector=...)` and `.options(label_selector=...)`; custom resources work on any Ray.
A request the cluster can never hold fails here in one line, before anything waits for resources.
Ensemble actors and Tune trials may use both vendors at once (`actor_options(vendor="any")`).
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass, field

import torch

from wxray.errors import ConfigError
from wxray.platform.cluster.devices import apply_rocm_worker_env, select_local_device
from wxray.platform.cluster.scaling import ScalingCfg

VENDORS = ("nvidia", "amd")  # this order breaks ties between vendors with as many free GPUs
NAMES = {"nvidia": "NVIDIA", "amd": "AMD", None: "unnamed-vendor"}
VENDOR_LABEL = "wxray.io/vendor"
TYPE_LABEL = "wxray.io/accelerator-type"
RAY_TYPE_LABEL = "ray.io/accelerator-type"  # Ray sets it on nodes whose GPUs it detected


def vendor_of_type(accelerator_type: str) -> str | None:
    """Ray's AMD accelerator types start with AMD- (AMD-Instinct-MI250X), its NVIDIA ones are bare (H100)."""
    if not accelerator_type or accelerator_type.startswith("Intel-"):
        return None
    return "amd" if accelerator_type.startswith("AMD-") else "nvidia"


@dataclass(frozen=True)
class Node:
    """An alive Ray node: its labels, total resources and free resources (None: unknown, taken as total)."""

    node_id: str
    labels: dict[str, str] = field(default_factory=dict)
    total: dict[str, float] = field(default_factory=dict)
    free: dict[str, float] | None = None

    @property
    def gpus(self) -> float:
        return self.total.get("GPU", 0.0)

    def types(self) -> set[str]:
        found = {k.split(":", 1)[1] for k in self.total if k.startswith("accelerator_type:")}
        return found | {self.labels[k] for k in (TYPE_LABEL, RAY_TYPE_LABEL) if self.labels.get(k)}

    @property
    def vendor(self) -> str | None:
        if self.labels.get(VENDOR_LABEL) in VENDORS:
            return self.labels[VENDOR_LABEL]
        for v in VENDORS:
            if self.total.get(v, 0) > 0:
                return v
        found = {vendor_of_type(t) for t in self.types()} - {None}
        return found.pop() if len(found) == 1 else None

    def holds(self, gpus: float, cpus: float, free: bool = False) -> int:
        """How many workers of `gpus` GPUs and `cpus` CPUs fit on this node (in what is free now: free=True)."""
        res = self.free if free and self.free is not None else self.total
        n = math.floor(res.get("GPU", 0.0) / gpus + 1e-9)
        return min(n, math.floor(res.get("CPU", 0.0) / cpus + 1e-9)) if cpus > 0 else n


def _values(selector: str) -> set[str]:
    return {v.strip() for v in selector[3:-1].split(",")} if selector.startswith("in(") else {selector}


@dataclass(frozen=True)
class Pin:
    """How work is kept on one vendor's nodes: a label selector, or the vendor's resource (one unit per GPU)."""

    vendor: str
    label_selector: dict[str, str] | None = None
    resource: str = ""

    def resources(self, gpus: float) -> dict[str, float]:
        return {self.resource: gpus} if self.resource else {}

    def options(self, num_gpus: float) -> dict:
        """`.options(...)` for a task or actor of `num_gpus` GPUs on this vendor's nodes."""
        out: dict = {"num_gpus": num_gpus}
        if self.resource:
            out["resources"] = self.resources(num_gpus)
        if self.label_selector:
            out["label_selector"] = dict(self.label_selector)
        return out

    def reaches(self, node: Node) -> bool:
        if self.resource:
            return node.total.get(self.resource, 0) > 0
        return all(node.labels.get(k) in _values(v) for k, v in (self.label_selector or {}).items())


def _of_vendor(vendor: str, nodes: list[Node], accelerator_type: str = "") -> list[Node]:
    key = f"accelerator_type:{accelerator_type}"
    return [n for n in nodes if n.gpus > 0 and n.vendor == vendor and (not accelerator_type or n.total.get(key))]


def pin_for(vendor: str, nodes: list[Node], accelerator_type: str = "") -> Pin:
    """The route that reaches every GPU node of `vendor` (else the most of its GPUs): the wxray.io/vendor label,
    the vendor resource, Ray's accelerator-type label, in this order; the label when there are no nodes to see."""
    mine = _of_vendor(vendor, nodes, accelerator_type)
    types = sorted({t for n in mine if vendor_of_type(t := n.labels.get(RAY_TYPE_LABEL, "")) == vendor})
    routes = [Pin(vendor, label_selector={VENDOR_LABEL: vendor}), Pin(vendor, resource=vendor)]
    if types:
        routes.append(Pin(vendor, label_selector={RAY_TYPE_LABEL: types[0] if len(types) == 1
                                                  else f"in({', '.join(types)})"}))
    reach = {id(p): [n for n in mine if p.reaches(n)] for p in routes}
    return max(routes, key=lambda p: (len(reach[id(p)]) == len(mine), sum(n.gpus for n in reach[id(p)])))


@dataclass(frozen=True)
class Placement:
    """Where a run's workers go: `pin` (None: wherever Ray finds room, as for CPU runs) and why, in one line."""

    pin: Pin | None = None
    reason: str = ""

    @property
    def vendor(self) -> str | None:
        return self.pin.vendor if self.pin else None


def describe(nodes: list[Node]) -> str:
    """What the cluster has, per vendor: 'NVIDIA 1 node(s), 8 GPUs, 64 CPUs; AMD ...' (or 'no GPU node')."""
    parts = []
    for v in (*VENDORS, None):
        mine = [n for n in nodes if n.gpus > 0 and n.vendor == v]
        if mine:
            parts.append(f"{NAMES[v]} {len(mine)} node(s), {sum(n.gpus for n in mine):g} GPUs, "
                         f"{sum(n.total.get('CPU', 0) for n in mine):g} CPUs")
    return "; ".join(parts) or "no GPU node"


def _fit(cfg: ScalingCfg, what: str, nodes: list[Node]) -> None:
    n, gpw, cpw = cfg.min_workers, cfg.gpus_per_worker, cfg.cpus_per_worker
    biggest = max((x.gpus for x in nodes), default=0.0)
    if gpw > biggest:
        raise ConfigError(f"scaling.gpus_per_worker={gpw}: no {what}GPU node has that many (the largest has "
                          f"{biggest:g}; {describe(nodes)})")
    holds = sum(x.holds(gpw, cpw) for x in nodes)
    if holds < n:
        raise ConfigError(f"scaling.num_workers={n} (each {gpw} GPU, {cpw:g} CPU) does not fit on the {what}GPU "
                          f"nodes: they hold {holds} such workers ({describe(nodes)})")


def _vendor_pin(cfg: ScalingCfg, vendor: str, nodes: list[Node]) -> Pin:
    mine = _of_vendor(vendor, nodes, cfg.accelerator_type)
    if not mine:
        raise ConfigError(f"scaling.vendor={vendor}: the Ray cluster has no {NAMES[vendor]} GPU node"
                          f"{' of scaling.accelerator_type=' + cfg.accelerator_type if cfg.accelerator_type else ''}"
                          f" ({describe(nodes)})")
    pin = pin_for(vendor, nodes, cfg.accelerator_type)
    reached = [n for n in mine if pin.reaches(n)]
    if not reached:
        raise ConfigError(f"scaling.vendor={vendor}: its GPU nodes carry neither the {VENDOR_LABEL}={vendor} label "
                          f"nor the {vendor} resource (see cluster.yaml)")
    _fit(cfg, NAMES[vendor] + " ", reached)
    return pin


def resolve(cfg: ScalingCfg, nodes: list[Node]) -> Placement:
    """The placement of a training run on `nodes`, or a one-line ConfigError when the cluster can never hold it.

    `scaling.vendor=any` takes the vendor whose GPUs hold the run and have the most free now (free enough for
    every worker first); a cluster whose GPU nodes name no vendor leaves the workers unpinned, as before.
    Capacity counts whole workers per node (GPUs and CPUs); what is busy now only steers the choice.
    """
    if not cfg.use_gpu:
        return Placement()
    n, gpw = cfg.min_workers, cfg.gpus_per_worker
    gpu_nodes = [x for x in nodes if x.gpus > 0]
    have = sum(x.gpus for x in gpu_nodes)
    if have < n * gpw:
        per = f" x scaling.gpus_per_worker={gpw}" if gpw > 1 else ""
        raise ConfigError(f"scaling.num_workers={n}{per} with use_gpu=true needs {n * gpw} GPUs; "
                          f"the Ray cluster has {have:g}")
    if cfg.accelerator_type:
        key = f"accelerator_type:{cfg.accelerator_type}"
        if not any(x.total.get(key) for x in gpu_nodes):
            kinds = sorted({t for x in nodes for t in x.types()})
            raise ConfigError(f"scaling.accelerator_type={cfg.accelerator_type!r} is not in the cluster "
                              f"(has: {', '.join(kinds) or 'none'})")
    if cfg.vendor != "any":
        return Placement(_vendor_pin(cfg, cfg.vendor, gpu_nodes), f"scaling.vendor={cfg.vendor}")
    known = [v for v in VENDORS if _of_vendor(v, gpu_nodes, cfg.accelerator_type)]
    if not known:
        key = f"accelerator_type:{cfg.accelerator_type}"
        _fit(cfg, "", [x for x in gpu_nodes if not cfg.accelerator_type or x.total.get(key)])
        return Placement(reason="no GPU node names its vendor: workers not pinned")
    pins, problems = [], []
    for v in known:
        try:
            pins.append(_vendor_pin(cfg, v, gpu_nodes))
        except ConfigError as e:
            problems.append(str(e))
    if not pins:
        raise ConfigError(f"scaling.vendor=any: no single vendor holds the run (a process group never mixes NCCL "
                          f"and RCCL): {'; '.join(problems)}")
    free = {}
    for p in pins:
        reached = [x for x in _of_vendor(p.vendor, gpu_nodes, cfg.accelerator_type) if p.reaches(x)]
        free[p.vendor] = (sum(x.holds(gpw, cfg.cpus_per_worker, free=True) for x in reached),
                          sum((x.total if x.free is None else x.free).get("GPU", 0.0) for x in reached))
    best = max(pins, key=lambda p: (free[p.vendor][0] >= n, free[p.vendor][1]))
    return Placement(best, f"scaling.vendor=any -> {best.vendor} ({free[best.vendor][1]:g} GPUs free there)")


def cluster_nodes() -> list[Node]:
    """The alive nodes of the connected Ray cluster; [] when Ray is not initialized."""
    import ray

    if not ray.is_initialized():
        return []
    try:  # DeveloperAPI in Ray 2.60; without it every resource counts as free
        from ray._private.state import available_resources_per_node

        free: dict | None = available_resources_per_node()
    except Exception:
        free = None
    return [Node(n["NodeID"], dict(n.get("Labels") or {}), dict(n.get("Resources") or {}),
                 None if free is None else dict(free.get(n["NodeID"], {})))
            for n in ray.nodes() if n.get("Alive")]


def actor_options(num_gpus: float, vendor: str = "any", key: str = "num_gpus") -> dict:
    """`.options(...)` for an ensemble-style actor (or task) of `num_gpus` GPUs: vendor=any is not pinned, so
    actors spread over both vendors' nodes; nvidia/amd pins by label or resource like a training run.
    On a connected cluster, a request no node can hold is a ConfigError naming `key` now, not a wait.
    Inside the actor, `device_for_actor()` gives its device."""
    if vendor not in (*VENDORS, "any"):
        raise ConfigError(f"vendor={vendor!r}: expected nvidia, amd or any")
    nodes = cluster_nodes()
    if num_gpus > 0 and nodes:
        pool = [n for n in nodes if n.gpus > 0 and (vendor == "any" or n.vendor == vendor)]
        what = "" if vendor == "any" else NAMES[vendor] + " "
        if not pool:
            raise ConfigError(f"{key}={num_gpus:g} (vendor={vendor}): the Ray cluster has no {what}GPU node "
                              f"({describe(nodes)})")
        if num_gpus > max(n.gpus for n in pool):
            raise ConfigError(f"{key}={num_gpus:g} (vendor={vendor}): no {what}GPU node has that many "
                              f"({describe(nodes)})")
    if vendor == "any" or num_gpus <= 0:
        return {"num_gpus": num_gpus}
    return pin_for(vendor, nodes).options(num_gpus)


def device_for_actor() -> torch.device:
    """The device of a Ray actor or task: cuda on NVIDIA and on AMD (ROCm torch calls its GPUs cuda), cpu when
    Ray gave it no GPU. Its index is 0 unless the process sees more GPUs than it was given (e.g. with
    RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES=1), then the position of its own GPU."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    try:
        import ray

        ids = [str(i) for i in ray.get_gpu_ids()] if ray.is_initialized() else []
    except Exception:
        ids = []
    if not ids:
        return torch.device("cpu") if _in_ray_worker() else torch.device("cuda")
    return torch.device("cuda", actor_device_index(os.environ, ids))


def actor_device_index(environ, gpu_ids: list[str], hip: bool | None = None) -> int:
    """Position of the first of `gpu_ids` among the GPUs this process sees: ROCm honours HIP_VISIBLE_DEVICES
    (which Ray sets for actors) before CUDA_VISIBLE_DEVICES; nothing set means every GPU, in id order."""
    hip = bool(torch.version.hip) if hip is None else hip
    name = "HIP_VISIBLE_DEVICES" if hip and environ.get("HIP_VISIBLE_DEVICES") is not None \
        else "CUDA_VISIBLE_DEVICES"
    if environ.get(name) is None:
        return select_local_device({}, 0, 1, gpu_ids, hip=hip).index
    return select_local_device({"CUDA_VISIBLE_DEVICES": environ[name]}, 0, 1, gpu_ids, hip=False).index


def _in_ray_worker() -> bool:
    try:
        import ray

        return ray.is_initialized() and ray.get_runtime_context().worker.mode == ray.WORKER_MODE
    except Exception:
        return False


@functools.cache
def rocm_torch_config_cls() -> type:
    """TorchConfig whose backend fixes ROCm device visibility first (see `devices.select_local_device`): Ray's
    torch backend, after `devices.apply_rocm_worker_env` on every worker, which runs once the node's GPU list
    is shared and before the process group or torch touches a GPU (a no-op off ROCm). Made on first use, so
    importing this module does not import Ray Train."""
    from ray.train.torch.config import TorchConfig, _TorchBackend

    class _RocmTorchBackend(_TorchBackend):
        def on_start(self, worker_group, backend_config):
            worker_group.execute(apply_rocm_worker_env)
            super().on_start(worker_group, backend_config)

    @dataclass
    class RocmTorchConfig(TorchConfig):
        @property
        def backend_cls(self):
            return _RocmTorchBackend

    return RocmTorchConfig
