from __future__ import annotations

import os

import pytest
import torch

from wxray.errors import ConfigError
from wxray.platform.cluster import devices, memory, resources, scaling


def test_saved_activation_meter_counts_activations_not_parameters():
    lin = torch.nn.Linear(8, 16)
    x = torch.randn(4, 8, requires_grad=True)
    meter = memory.SavedActivationMeter(memory.SavedActivationMeter.parameter_pointers(lin))
    with meter.measure():
        y = torch.relu(lin(x))
    # linear saves its input (4x8 floats); relu saves its output (4x16 floats); the weight is excluded
    assert meter.bytes == (4 * 8 + 4 * 16) * 4
    y.sum().backward()  # the hooks must not break backward
    assert x.grad is not None


def test_precision_policy():
    cpu = torch.device("cpu")
    assert devices.autocast_dtype("auto", cpu) is None  # CPUs train in fp32 unless asked
    assert devices.autocast_dtype("bf16", cpu) is torch.bfloat16
    assert devices.autocast_dtype("fp32", cpu) is None


def test_cluster_fit_errors_name_the_key(ray_session):
    with pytest.raises(ConfigError, match="scaling.num_workers=3 x scaling.cpus_per_worker=1.0"):
        resources.check_cluster_fits(scaling.ScalingCfg(num_workers=3))
    with pytest.raises(ConfigError, match="use_gpu=true needs 1 GPUs; the Ray cluster has 0"):
        resources.check_cluster_fits(scaling.ScalingCfg(num_workers=1, use_gpu=True, cpus_per_worker=0.5))
    resources.check_cluster_fits(scaling.ScalingCfg(num_workers=2, cpus_per_worker=0.5), reserve_cpus=0.25)
    with pytest.raises(ConfigError, match="accelerator_type is set but scaling.use_gpu=false"):
        scaling.ScalingCfg(accelerator_type="AMD-Instinct-MI250X").validate()


def test_scaling_config_carries_accelerator_type():
    sc = resources.ray_scaling_config(scaling.ScalingCfg(num_workers=2, use_gpu=True, accelerator_type="H100"))
    assert sc.num_workers == 2 and sc.use_gpu and sc.accelerator_type == "H100"
    assert sc.resources_per_worker == {"CPU": 1.0, "GPU": 1}


@pytest.mark.gpu
def test_bf16_train_step_on_gpu():
    from wxray.models import build_model, lat_weighted_mse, latitude_weights

    dev = torch.device("cuda")
    model = build_model("reslim", n_vars=3, history=2, n_const=0, n_out=3, img_size=(16, 32), patch_size=2,
                        embed_dim=64, depth=4, num_heads=4, split=(1, 2, 1), keep_ratio=0.25).to(dev)
    x, y = torch.randn(2, 6, 16, 32, device=dev), torch.randn(2, 3, 16, 32, device=dev)
    dtype = devices.autocast_dtype("auto", dev)
    with devices.autocast(dev, dtype):
        pred = model(x, generator=torch.Generator().manual_seed(0))
    loss = lat_weighted_mse(pred.float(), y, latitude_weights(torch.linspace(-80, 80, 16, device=dev)))
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in model.parameters() if p.requires_grad)
    assert memory.peak_memory_bytes(dev) > 0


# --- vendor config ----------------------------------------------------------------------------------------------

def test_vendor_keys_need_gpus_and_agree_with_the_accelerator_type():
    for kw in ({"vendor": "amd"}, {"gpus_per_worker": 2}):
        with pytest.raises(ConfigError, match=f"scaling.{next(iter(kw))} is set but scaling.use_gpu=false"):
            scaling.ScalingCfg(**kw).validate()
    with pytest.raises(ConfigError, match="'AMD-Instinct-MI250X' is an AMD type but scaling.vendor=nvidia"):
        scaling.ScalingCfg(use_gpu=True, vendor="nvidia", accelerator_type="AMD-Instinct-MI250X").validate()
    with pytest.raises(ConfigError, match="'H100' is not an AMD type but scaling.vendor=amd"):
        scaling.ScalingCfg(use_gpu=True, vendor="amd", accelerator_type="H100").validate()
    scaling.ScalingCfg(use_gpu=True, vendor="amd", accelerator_type="AMD-Instinct-MI250X", gpus_per_worker=2).validate()


def test_cpu_scaling_config_is_unchanged():
    sc = resources.ray_scaling_config(scaling.ScalingCfg(num_workers=2, cpus_per_worker=0.5))
    assert sc.num_workers == 2 and not sc.use_gpu and sc.resources_per_worker == {"CPU": 0.5}
    assert sc.label_selector is None and sc.accelerator_type is None


def test_elastic_num_workers_parse_validate_and_reach_ray():
    from wxray.job import prepare
    from wxray.platform.train.config import TrainSparseConfig

    cfg = prepare("train_sparse", TrainSparseConfig, ["scaling.num_workers=[2,4]", "scaling.resize_interval_s=5"])
    s = cfg.scaling
    assert s.elastic and (s.min_workers, s.max_workers) == (2, 4) and s.describe() == "2-4 workers (elastic)"
    sc = resources.ray_scaling_config(s)
    assert (sc.min_workers, sc.max_workers) == (2, 4) and sc.elastic_resize_monitor_interval_s == 5
    fixed = scaling.ScalingCfg(num_workers=3)
    assert not fixed.elastic and (fixed.min_workers, fixed.max_workers) == (3, 3)
    with pytest.raises(ConfigError, match=r"scaling.num_workers=\[4, 2\]: expected \[min, max\] with min <= max"):
        scaling.ScalingCfg(num_workers=(4, 2)).validate()
    with pytest.raises(ConfigError, match="scaling.num_workers"):
        prepare("train_sparse", TrainSparseConfig, ["scaling.num_workers=[0,2]"])


def test_the_lr_schedule_does_not_move_when_an_elastic_run_resizes():
    from wxray.job import prepare
    from wxray.platform.train.config import TrainSparseConfig
    from wxray.platform.train.schedule import sample_schedule

    cfg = prepare("train_sparse", TrainSparseConfig, ["scaling.num_workers=[1,4]", "optim.warmup_steps=5",
                                                      "train.max_steps_per_epoch=3", "data.batch_size=2",
                                                      "optim.lr_scaling=0.8"])
    at = {w: sample_schedule(cfg, 1000, w) for w in (1, 2, 4)}
    assert at[1][:2] == at[2][:2] == at[4][:2] == (cfg.train.epochs * 3 * 4 * 2, 5 * 4 * 2)  # in windows
    assert at[1][2] < at[2][2] < at[4][2]  # the peak LR follows the global batch running now


# --- ROCm device visibility -------------------------------------------------------------------------------------
# A node with 8 GPUs and two Train workers holding Ray GPU ids a and b. `rocm_device` plays the ROCm runtime:
# ROCR_VISIBLE_DEVICES filters the physical GPUs, then HIP_VISIBLE_DEVICES (or, unset, CUDA_VISIBLE_DEVICES)
# picks among those; cuda:<ordinal> is the ordinal-th of what is left.

def rocm_device(env: dict, ordinal: int, physical: int = 8) -> int:
    devices = list(range(physical))
    if "ROCR_VISIBLE_DEVICES" in env:
        devices = [devices[int(i)] for i in env["ROCR_VISIBLE_DEVICES"].split(",")]
    pick = env.get("HIP_VISIBLE_DEVICES", env.get("CUDA_VISIBLE_DEVICES"))
    if pick is not None:
        devices = [devices[int(i)] for i in pick.split(",")]
    if ordinal >= len(devices):
        raise RuntimeError("HIP error: invalid device ordinal")
    return devices[ordinal]


def ray_env(case: str, own: str, shared: str, rocr: str | None = None) -> dict:
    """A worker's environment as Ray 2.60 + Train V2 leave it."""
    env = {"CUDA_VISIBLE_DEVICES": shared}  # Train V2: every GPU of the node's workers
    if case == "ray-default":
        env["HIP_VISIBLE_DEVICES"] = own  # Ray core: the worker's own GPU
    elif case == "noset-raylet-list":  # RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES=1, raylet started with a list
        env["HIP_VISIBLE_DEVICES"] = ",".join(map(str, range(len(rocr.split(",")) if rocr else 8)))
    if rocr is not None:
        env["ROCR_VISIBLE_DEVICES"] = rocr
    return env


@pytest.mark.parametrize("case", ["ray-default", "noset-raylet-list", "noset-nothing-inherited"])
@pytest.mark.parametrize("ids,rocr", [(("6", "7"), None), (("0", "1"), None), (("2", "5"), "0,1,2,3,4,5,6,7"),
                                      (("2", "3"), "4,5,6,7")])
def test_rocm_two_workers_per_node_get_their_own_gpus(case, ids, rocr):
    shared = ",".join(ids)
    expected = [int(rocr.split(",")[int(i)]) if rocr else int(i) for i in ids]  # the physical GPUs Ray gave
    envs = [ray_env(case, own, shared, rocr) for own in ids]
    got = []
    for rank, (own, env) in enumerate(zip(ids, envs, strict=True)):
        for gpu_ids in ([own], None):  # by Ray's GPU id, or by local rank alone
            dev = devices.select_local_device(env, rank, 2, gpu_ids, hip=True)
            assert dev.index == rank == list(ids).index(own)  # what ray.train.torch.get_device() asks for
            fixed = {**env, **dev.env}
            assert fixed["HIP_VISIBLE_DEVICES"] == fixed["CUDA_VISIBLE_DEVICES"] == shared
        got.append(rocm_device(fixed, dev.index))
    assert got == expected  # each worker on its own GPU, the one Ray assigned
    if case == "ray-default":  # without the fix, local rank 1 asks for cuda:1 while ROCm shows it one GPU
        with pytest.raises(RuntimeError, match="invalid device ordinal"):
            rocm_device(envs[1], 1)


def test_rocm_mapping_more_gpus_per_worker_and_nvidia():
    env = {"CUDA_VISIBLE_DEVICES": "4,5,6,7", "HIP_VISIBLE_DEVICES": "6,7"}
    dev = devices.select_local_device(env, 1, 2, ["6", "7"], hip=True)
    assert dev.index == 2 and dev.env == {"HIP_VISIBLE_DEVICES": "4,5,6,7"}
    assert devices.select_local_device(env, 1, 2, hip=True).index == 2  # rank 1's share of 4 GPUs: the last two
    nvidia = devices.select_local_device({"CUDA_VISIBLE_DEVICES": "6,7", "HIP_VISIBLE_DEVICES": "7"}, 1, 2, ["7"],
                                     hip=False)
    assert nvidia == devices.LocalDevice(1)  # NVIDIA: nothing to change, HIP_VISIBLE_DEVICES is not read
    assert devices.select_local_device({}, 1, 2, ["5"], hip=True) == devices.LocalDevice(5)  # nothing restricts
    assert devices.select_local_device({"HIP_VISIBLE_DEVICES": "3"}, 0, 1, ["3"], hip=True) == devices.LocalDevice(
        0, {"CUDA_VISIBLE_DEVICES": "3"})  # no Train sharing: the worker's own list stands


def test_rocm_mapping_errors_are_one_clear_line():
    with pytest.raises(ConfigError, match=r"^GPU id\(s\) 6,7 do not fit ROCR_VISIBLE_DEVICES=4,5,6,7: HIP ids count "
                                          r"within its 4 GPU\(s\); start Ray there with HIP_VISIBLE_DEVICES=0,1,2,3"):
        devices.select_local_device(ray_env("ray-default", "7", "6,7", "4,5,6,7"), 1, 2, ["7"], hip=True)
    with pytest.raises(ConfigError, match=r"^GPU 3 that Ray gave local rank 1 is not in CUDA_VISIBLE_DEVICES=6,7"):
        devices.select_local_device({"CUDA_VISIBLE_DEVICES": "6,7"}, 1, 2, ["3"], hip=True)
    with pytest.raises(ConfigError, match="CUDA_VISIBLE_DEVICES=0,1,2 lists 3 GPUs for 2 workers on this node"):
        devices.select_local_device({"CUDA_VISIBLE_DEVICES": "0,1,2"}, 1, 2, hip=True)
    with pytest.raises(ConfigError, match="CUDA_VISIBLE_DEVICES='' hides every GPU from local rank 0"):
        devices.select_local_device({"CUDA_VISIBLE_DEVICES": ""}, 0, 1, ["0"], hip=True)
    with pytest.raises(ConfigError, match="local rank 2 of 2 worker"):
        devices.select_local_device({}, 2, 2, hip=True)


def test_rocm_runtime_env_and_noop_off_rocm(monkeypatch):
    assert devices.ROCM_RUNTIME_ENV == {"env_vars": {"RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES": "1"}}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "6,7")
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "7")
    assert devices.select_local_device(dict(os.environ), 1, 2, ["7"]).env == {}  # this torch: no HIP
    monkeypatch.setattr(torch.version, "hip", "6.4.0", raising=False)
    assert devices.select_local_device(dict(os.environ), 1, 2, ["7"]).env == {
        "HIP_VISIBLE_DEVICES": "6,7"}


# --- bf16 and attention kernels per device ----------------------------------------------------------------------

def gpu(major=0, minor=0, arch=""):
    from types import SimpleNamespace

    return SimpleNamespace(major=major, minor=minor, gcnArchName=arch, name="fake")


def test_bf16_support_per_device():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert devices.bf16_supported(cpu)
    assert devices.bf16_supported(cuda, gpu(8, 0), hip=False) and devices.bf16_supported(cuda, gpu(9, 0), hip=False)
    assert not devices.bf16_supported(cuda, gpu(7, 0), hip=False)  # V100: emulated only
    assert devices.bf16_supported(cuda, gpu(9, 0, "gfx90a:sramecc+:xnack-"), hip=True)  # MI250X
    assert devices.bf16_supported(cuda, gpu(9, 4, "gfx942:sramecc+:xnack-"), hip=True)  # MI300X
    assert not devices.bf16_supported(cuda, gpu(9, 0, "gfx906:sramecc+:xnack-"), hip=True)  # MI50


def test_sdpa_backends_per_device():
    from torch.nn.attention import SDPBackend as B

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    fast = [B.FLASH_ATTENTION, B.EFFICIENT_ATTENTION, B.MATH]
    assert devices.sdpa_backends(cpu) is None  # torch's own choice
    assert devices.sdpa_backends(cuda, gpu(9, 0), hip=False, flash_built=True) == fast  # H100
    assert devices.sdpa_backends(cuda, gpu(7, 0), hip=False, flash_built=True) == [B.EFFICIENT_ATTENTION, B.MATH]
    assert devices.sdpa_backends(cuda, gpu(8, 0), hip=False, flash_built=False) == [B.EFFICIENT_ATTENTION, B.MATH]
    assert devices.sdpa_backends(cuda, gpu(9, 0, "gfx90a:sramecc+:xnack-"), hip=True, flash_built=True) == fast
    assert devices.sdpa_backends(cuda, gpu(9, 4, "gfx942"), hip=True, flash_built=True) == fast
    assert devices.sdpa_backends(cuda, gpu(9, 0, "gfx906"), hip=True, flash_built=True) == [B.MATH]
    assert devices.sdpa_backends(cuda, gpu(9, 0, "gfx90a"), hip=True, flash_built=False) == [B.MATH]
    q = torch.randn(1, 2, 5, 8)
    with devices.sdpa_context(cpu), devices.compute(cpu, None):
        out = torch.nn.functional.scaled_dot_product_attention(q, q, q)
    assert torch.allclose(out, torch.nn.functional.scaled_dot_product_attention(q, q, q), atol=1e-6)


def test_autocast_follows_bf16_support(monkeypatch):
    props = {"props": gpu(9, 0, "gfx90a:sramecc+:xnack-")}
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props["props"])
    monkeypatch.setattr(torch.version, "hip", "6.4.0", raising=False)
    cuda = torch.device("cuda")
    assert devices.autocast_dtype("auto", cuda) is torch.bfloat16
    props["props"] = gpu(9, 0, "gfx906")
    assert devices.autocast_dtype("auto", cuda) is None and devices.autocast_dtype("fp32", cuda) is None
