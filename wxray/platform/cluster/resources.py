"""What a training run asks Ray for (`ScalingConfig`, the torch backend) and whether the cluster can hold it."""

from __future__ import annotations

from wxray.console import say
from wxray.errors import ConfigError
from wxray.platform.cluster import placement
from wxray.platform.cluster.scaling import ScalingCfg


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
            pin = placement.pin_for(cfg.vendor, placement.cluster_nodes(), cfg.accelerator_type)
            kwargs["resources_per_worker"].update(pin.resources(cfg.gpus_per_worker))
            if pin.label_selector:
                kwargs["label_selector"] = dict(pin.label_selector)
    return ScalingConfig(**kwargs)


def torch_config(cfg: ScalingCfg):
    """TorchTrainer's `torch_config`: None (Ray's default) except for GPU runs that may land on AMD nodes,
    which get the ROCm device fix (`placement.rocm_torch_config_cls`, see `devices.select_local_device`)."""
    if not cfg.use_gpu or cfg.vendor == "nvidia":
        return None
    return placement.rocm_torch_config_cls()()


def check_cluster_fits(cfg: ScalingCfg, reserve_cpus: float = 0.0):
    """Fail fast with one line when the cluster cannot hold the workers (Ray would wait forever).

    A GPU run also gets its vendor here (`placement.resolve`): `scaling.vendor=any` becomes the vendor
    chosen, so the ScalingConfig built later pins the workers to the same nodes. Returns the Placement.
    """
    import ray

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
