"""Vendor-aware placement: resolution and capacity errors on described nodes, and on a local multi-node cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray

from wxray.errors import ConfigError
from wxray.platform.cluster import placement as pl
from wxray.platform.cluster import resources, scaling

ROOT = Path(__file__).resolve().parents[2]


def node(name: str, gpus: float = 8, vendor: str | None = None, label: bool = True, resource: bool = True,
         cpus: float = 64, free_gpus: float | None = None, types: tuple[str, ...] = (),
         ray_type: str = "") -> pl.Node:
    labels, total = {}, {"CPU": cpus, "GPU": gpus} if gpus else {"CPU": cpus}
    if vendor and label:
        labels[pl.VENDOR_LABEL] = vendor
    if vendor and resource:
        total[vendor] = gpus
    for t in types:
        total[f"accelerator_type:{t}"] = 1
    if ray_type:
        labels[pl.RAY_TYPE_LABEL] = ray_type
    free = None if free_gpus is None else {**total, "GPU": free_gpus}
    return pl.Node(name, labels, total, free)


def mixed(nvidia_free: float | None = None, amd_free: float | None = None) -> list[pl.Node]:
    """A CPU head, two 8-GPU NVIDIA nodes and one 8-GPU AMD node, labelled and with vendor resources."""
    return [node("head", gpus=0), node("n1", vendor="nvidia", free_gpus=nvidia_free, types=("H100",)),
            node("n2", vendor="nvidia", free_gpus=nvidia_free, types=("H100",)),
            node("a1", vendor="amd", free_gpus=amd_free, types=("AMD-Instinct-MI250X",))]


def gpu_cfg(**kw) -> scaling.ScalingCfg:
    cfg = scaling.ScalingCfg(use_gpu=True, **kw)
    cfg.validate()
    return cfg


def test_any_prefers_the_vendor_with_more_free_gpus():
    found = pl.resolve(gpu_cfg(num_workers=4), mixed(nvidia_free=2, amd_free=8))
    assert found.vendor == "amd" and found.pin.label_selector == {pl.VENDOR_LABEL: "amd"}
    assert "amd" in found.reason
    assert pl.resolve(gpu_cfg(num_workers=4), mixed(nvidia_free=8, amd_free=8)).vendor == "nvidia"  # more free
    busy = [pl.Node(n.node_id, n.labels, n.total, {} if n.vendor == "nvidia" else None) for n in mixed()]
    assert pl.resolve(gpu_cfg(num_workers=4), busy).vendor == "amd"  # Ray lists nothing free on a full node


def test_any_needs_one_vendor_to_hold_the_whole_run():
    # 12 workers fit only on NVIDIA's 16 GPUs, however free the AMD node is
    assert pl.resolve(gpu_cfg(num_workers=12), mixed(nvidia_free=0, amd_free=8)).vendor == "nvidia"
    # a vendor with enough free room for every worker beats one with more free but fragmented GPUs
    nodes = [node(f"n{i}", vendor="nvidia", free_gpus=3) for i in range(4)] + [node("a", vendor="amd")]
    assert pl.resolve(gpu_cfg(num_workers=2, gpus_per_worker=4), nodes).vendor == "amd"
    with pytest.raises(ConfigError, match=r"scaling.vendor=any: no single vendor holds the run .*NCCL and RCCL"):
        pl.resolve(gpu_cfg(num_workers=20), mixed())


def test_impossible_requests_name_the_key_and_what_the_cluster_has():
    only_nvidia = [node("head", gpus=0), node("n1", vendor="nvidia"), node("n2", vendor="nvidia")]
    with pytest.raises(ConfigError, match=r"^scaling.vendor=amd: the Ray cluster has no AMD GPU node "
                                          r"\(NVIDIA 2 node\(s\), 16 GPUs, 128 CPUs\)$"):
        pl.resolve(gpu_cfg(vendor="amd"), only_nvidia)
    with pytest.raises(ConfigError, match=r"^scaling.gpus_per_worker=16: no AMD GPU node has that many "
                                          r"\(the largest has 8; AMD 1 node\(s\), 8 GPUs, 64 CPUs\)$"):
        pl.resolve(gpu_cfg(vendor="amd", gpus_per_worker=16), mixed())
    with pytest.raises(ConfigError, match=r"^scaling.num_workers=9 \(each 1 GPU, 1 CPU\) does not fit on the AMD "
                                          r"GPU nodes: they hold 8 such workers \(AMD 1 node\(s\), 8 GPUs"):
        pl.resolve(gpu_cfg(vendor="amd", num_workers=9), mixed())
    with pytest.raises(ConfigError, match="they hold 4 such workers"):  # CPUs run out first on a GPU node
        pl.resolve(gpu_cfg(vendor="amd", num_workers=5, cpus_per_worker=16), mixed())
    with pytest.raises(ConfigError, match="^scaling.num_workers=1 with use_gpu=true needs 1 GPUs; the Ray "
                                          "cluster has 0$"):
        pl.resolve(gpu_cfg(), [node("head", gpus=0)])
    with pytest.raises(ConfigError, match=r"scaling.accelerator_type='A100' is not in the cluster "
                                          r"\(has: AMD-Instinct-MI250X, H100\)"):
        pl.resolve(gpu_cfg(accelerator_type="A100"), mixed())


def test_accelerator_type_narrows_the_vendor():
    assert pl.resolve(gpu_cfg(accelerator_type="H100"), mixed(nvidia_free=0)).vendor == "nvidia"
    found = pl.resolve(gpu_cfg(accelerator_type="AMD-Instinct-MI250X", vendor="amd"), mixed())
    assert found.vendor == "amd"
    with pytest.raises(ConfigError, match="^scaling.vendor=nvidia: the Ray cluster has no NVIDIA GPU node of "
                                          "scaling.accelerator_type=MI "):
        pl.resolve(gpu_cfg(accelerator_type="MI", vendor="nvidia"),
                   [node("n", vendor="nvidia"), node("m", vendor="amd", types=("MI",))])


def test_pin_route_label_then_resource_then_rays_accelerator_type():
    assert pl.pin_for("amd", mixed()).label_selector == {pl.VENDOR_LABEL: "amd"}
    slurm_without_labels = [node("a1", vendor="amd", label=False), node("a2", vendor="amd", label=False)]
    pin = pl.pin_for("amd", slurm_without_labels)
    assert pin.resource == "amd" and pin.options(2) == {"num_gpus": 2, "resources": {"amd": 2}}
    # half labelled, half with the resource only: the route that reaches every node wins
    half = [node("a1", vendor="amd", resource=False), node("a2", vendor="amd", label=False, gpus=4)]
    assert pl.pin_for("amd", half).resource == "" and pl.pin_for("amd", half).label_selector  # 8 GPUs > 4
    detected = [node("n1", vendor=None, ray_type="H100"), node("n2", vendor=None, ray_type="A100"),
                node("a1", vendor=None, ray_type="AMD-Instinct-MI250X")]
    assert [n.vendor for n in detected] == ["nvidia", "nvidia", "amd"]
    assert pl.pin_for("nvidia", detected).label_selector == {pl.RAY_TYPE_LABEL: "in(A100, H100)"}
    assert pl.resolve(gpu_cfg(num_workers=10), detected).vendor == "nvidia"
    assert pl.pin_for("amd", []).label_selector == {pl.VENDOR_LABEL: "amd"}  # no cluster to look at


def test_gpu_nodes_without_a_vendor_stay_unpinned_and_cpu_runs_are_untouched():
    plain = [node("g1"), node("g2")]
    found = pl.resolve(gpu_cfg(num_workers=16), plain)
    assert found.pin is None and "not pinned" in found.reason
    with pytest.raises(ConfigError, match="scaling.gpus_per_worker=9: no GPU node has that many"):
        pl.resolve(gpu_cfg(gpus_per_worker=9), plain)
    assert pl.resolve(scaling.ScalingCfg(num_workers=64), mixed()) == pl.Placement()


def test_check_cluster_fits_records_the_vendor_and_the_scaling_config_pins_it(monkeypatch):
    nodes = mixed(nvidia_free=0)
    monkeypatch.setattr(pl, "cluster_nodes", lambda: nodes)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 192.0, "GPU": 24.0})
    cfg = gpu_cfg(num_workers=2, gpus_per_worker=2)
    assert resources.check_cluster_fits(cfg).vendor == "amd" and cfg.vendor == "amd"
    sc = resources.ray_scaling_config(cfg)
    assert sc.label_selector == {pl.VENDOR_LABEL: "amd"} and sc.resources_per_worker == {"CPU": 1.0, "GPU": 2}
    assert isinstance(resources.torch_config(cfg), pl.rocm_torch_config_cls())
    nodes[:] = [node(n.node_id, vendor=n.vendor, label=False, gpus=n.gpus) for n in nodes]  # resources only
    sc = resources.ray_scaling_config(cfg)
    assert sc.label_selector is None and sc.resources_per_worker == {"CPU": 1.0, "GPU": 2, "amd": 2}
    cpu = scaling.ScalingCfg(num_workers=2)
    assert resources.check_cluster_fits(cpu) == pl.Placement() and cpu.vendor == "any"
    assert resources.torch_config(cpu) is None and resources.torch_config(gpu_cfg(vendor="nvidia")) is None


def test_actor_options(monkeypatch):
    monkeypatch.setattr(pl, "cluster_nodes", lambda: mixed())
    assert pl.actor_options(1) == {"num_gpus": 1}  # both vendors at once
    assert pl.actor_options(2, "amd") == {"num_gpus": 2, "label_selector": {pl.VENDOR_LABEL: "amd"}}
    assert pl.actor_options(0, "amd") == {"num_gpus": 0}
    with pytest.raises(ConfigError, match=r"^ensemble.gpus_per_member=16 \(vendor=nvidia\): no NVIDIA GPU node "
                                          r"has that many"):
        pl.actor_options(16, "nvidia", key="ensemble.gpus_per_member")
    monkeypatch.setattr(pl, "cluster_nodes", lambda: [node("head", gpus=0), node("n", vendor="nvidia")])
    with pytest.raises(ConfigError, match=r"num_gpus=1 \(vendor=amd\): the Ray cluster has no AMD GPU node"):
        pl.actor_options(1, "amd")
    with pytest.raises(ConfigError, match="vendor='intel': expected nvidia, amd or any"):
        pl.actor_options(1, "intel")


def test_actor_device_index():
    # Ray's default: HIP_VISIBLE_DEVICES is the actor's own GPU (CUDA_VISIBLE_DEVICES may be inherited wider)
    assert pl.actor_device_index({"HIP_VISIBLE_DEVICES": "3", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}, ["3"],
                                 hip=True) == 0
    # RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES=1 with the node's list inherited: the actor's own position
    assert pl.actor_device_index({"HIP_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}, ["5"], hip=True) == 5
    assert pl.actor_device_index({}, ["5"], hip=True) == 5
    assert pl.actor_device_index({"CUDA_VISIBLE_DEVICES": "5", "HIP_VISIBLE_DEVICES": "1"}, ["5"], hip=False) == 0
    assert str(pl.device_for_actor()) == "cpu"  # this machine has no GPU


CLUSTER_SCRIPT = r"""
import json, sys, time
t0 = time.monotonic()
import ray
from ray.cluster_utils import Cluster
from wxray.errors import ConfigError
from wxray.platform.cluster import placement as pl
from wxray.platform.cluster import resources, scaling

# Two tiny nodes standing for the vendors, with fake GPUs (num_gpus): the head is the NVIDIA node with
# cluster.yaml's label and vendor resource; the AMD node is named only by its resource (the other route).
cluster = Cluster(initialize_head=True, head_node_args={
    "num_cpus": 2, "num_gpus": 2, "resources": {"nvidia": 2}, "labels": {"wxray.io/vendor": "nvidia"},
    "include_dashboard": False})
cluster.add_node(num_cpus=2, num_gpus=2, resources={"amd": 2})
ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
cluster.wait_for_nodes()
out = {"startup_s": time.monotonic() - t0}
vendor = {n["NodeID"]: n["Labels"].get("wxray.io/vendor") or ("amd" if n["Resources"].get("amd") else "cpu")
          for n in ray.nodes()}

@ray.remote(num_cpus=0)
def where():
    return ray.get_runtime_context().get_node_id()

@ray.remote(num_cpus=0)
class Member:
    def where(self):
        return ray.get_runtime_context().get_node_id(), str(pl.device_for_actor())

# (a) one NVIDIA GPU busy: vendor=any resolves to AMD (more free), tasks placed like its workers stay there
busy = Member.options(**pl.actor_options(1, "nvidia")).remote()
out["busy_on"] = vendor[ray.get(busy.where.remote())[0]]
cfg = scaling.ScalingCfg(num_workers=2, use_gpu=True, cpus_per_worker=0.5)
found = resources.check_cluster_fits(cfg)
sc = resources.ray_scaling_config(cfg)
out["resolved"], out["recorded"] = found.vendor, cfg.vendor
out["resources_per_worker"], out["label_selector"] = sc.resources_per_worker, sc.label_selector
out["tasks_on"] = sorted(vendor[n] for n in ray.get([where.options(**found.pin.options(1)).remote()
                                                     for _ in range(4)]))
# ... and a real Ray Train run with that ScalingConfig: both workers on the AMD node (gloo: no GPU here)
import tempfile
from ray.train import RunConfig
from ray.train.torch import TorchConfig, TorchTrainer

def report_node(config):
    import ray.train
    rank = ray.train.get_context().get_world_rank()
    with open(f"{config['out']}/rank{rank}", "w") as f:
        f.write(ray.get_runtime_context().get_node_id())

with tempfile.TemporaryDirectory() as tmp:
    TorchTrainer(report_node, train_loop_config={"out": tmp}, scaling_config=sc,
                 torch_config=TorchConfig(backend="gloo"),
                 run_config=RunConfig(storage_path=f"{tmp}/ray", name="where")).fit()
    out["trained_on"] = sorted(vendor[open(f"{tmp}/rank{r}").read()] for r in range(2))
ray.kill(busy)
out["a_s"] = time.monotonic() - t0
# (b) unpinned ensemble actors: three 1-GPU members cannot fit on one 2-GPU node, so they span both vendors
members = [Member.options(**pl.actor_options(1)).remote() for _ in range(3)]
got = ray.get([m.where.remote() for m in members])
out["members_on"], out["member_devices"] = sorted(vendor[n] for n, _ in got), sorted({d for _, d in got})
out["b_s"] = time.monotonic() - t0
# (c) impossible requests: an error at once, never a wait
t = time.monotonic()
errors = []
for call in (lambda: resources.check_cluster_fits(scaling.ScalingCfg(num_workers=3, use_gpu=True, vendor="amd",
                                                           cpus_per_worker=0.5)),
             lambda: resources.check_cluster_fits(scaling.ScalingCfg(use_gpu=True, gpus_per_worker=3)),
             lambda: pl.actor_options(3, "amd", key="ensemble.gpus_per_member")):
    try:
        call()
        errors.append(None)
    except ConfigError as e:
        errors.append(str(e))
out["errors"], out["errors_s"] = errors, time.monotonic() - t
out["total_s"] = time.monotonic() - t0
print("RESULT " + json.dumps(out), flush=True)
ray.shutdown()
cluster.shutdown()
"""


@pytest.mark.slow
def test_vendors_on_a_local_multi_node_cluster(tmp_path):
    """A `ray.cluster_utils.Cluster` in a subprocess (its own ray.init must not touch the session cluster)."""
    start = time.monotonic()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run([sys.executable, "-c", CLUSTER_SCRIPT], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=240)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT "):])
    print(f"cluster test: {time.monotonic() - start:.1f} s wall; in the script: startup {out['startup_s']:.1f} s, "
          f"(a) done {out['a_s']:.1f} s, (b) {out['b_s']:.1f} s, all {out['total_s']:.1f} s")
    assert out["busy_on"] == "nvidia"
    assert out["resolved"] == out["recorded"] == "amd"
    assert out["resources_per_worker"] == {"CPU": 0.5, "GPU": 1, "amd": 1} and out["label_selector"] is None
    assert out["tasks_on"] == ["amd"] * 4 and out["trained_on"] == ["amd"] * 2
    assert set(out["members_on"]) == {"nvidia", "amd"} and out["member_devices"] == ["cpu"]
    amd_short, per_worker, actor = out["errors"]
    assert amd_short.startswith("scaling.num_workers=3 (each 1 GPU, 0.5 CPU) does not fit on the AMD GPU nodes: "
                                "they hold 2 such workers (AMD 1 node(s), 2 GPUs, 2 CPUs)")
    assert per_worker.startswith("scaling.vendor=any: no single vendor holds the run")
    assert actor.startswith("ensemble.gpus_per_member=3 (vendor=amd): no AMD GPU node has that many")
    assert out["errors_s"] < 2.0
