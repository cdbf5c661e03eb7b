from __future__ import annotations

import pytest
import torch

from wxray.errors import ConfigError
from wxray.platform import accelerators as acc


def test_saved_activation_meter_counts_activations_not_parameters():
    lin = torch.nn.Linear(8, 16)
    x = torch.randn(4, 8, requires_grad=True)
    meter = acc.SavedActivationMeter(acc.SavedActivationMeter.parameter_pointers(lin))
    with meter.measure():
        y = torch.relu(lin(x))
    # linear saves its input (4x8 floats); relu saves its output (4x16 floats); the weight is excluded
    assert meter.bytes == (4 * 8 + 4 * 16) * 4
    y.sum().backward()  # the hooks must not break backward
    assert x.grad is not None


def test_precision_policy():
    cpu = torch.device("cpu")
    assert acc.autocast_dtype("auto", cpu) is None  # CPUs train in fp32 unless asked
    assert acc.autocast_dtype("bf16", cpu) is torch.bfloat16
    assert acc.autocast_dtype("fp32", cpu) is None


def test_cluster_fit_errors_name_the_key(ray_session):
    with pytest.raises(ConfigError, match="scaling.num_workers=3 x scaling.cpus_per_worker=1.0"):
        acc.check_cluster_fits(acc.ScalingCfg(num_workers=3))
    with pytest.raises(ConfigError, match="use_gpu=true needs 1 GPUs; the Ray cluster has 0"):
        acc.check_cluster_fits(acc.ScalingCfg(num_workers=1, use_gpu=True, cpus_per_worker=0.5))
    acc.check_cluster_fits(acc.ScalingCfg(num_workers=2, cpus_per_worker=0.5), reserve_cpus=0.25)
    with pytest.raises(ConfigError, match="accelerator_type is set but scaling.use_gpu=false"):
        acc.ScalingCfg(accelerator_type="AMD-Instinct-MI250X").validate()


def test_scaling_config_carries_accelerator_type():
    sc = acc.ray_scaling_config(acc.ScalingCfg(num_workers=2, use_gpu=True, accelerator_type="H100"))
    assert sc.num_workers == 2 and sc.use_gpu and sc.accelerator_type == "H100"
    assert sc.resources_per_worker == {"CPU": 1.0, "GPU": 1}


@pytest.mark.gpu
def test_bf16_train_step_on_gpu():
    from wxray.models import build_model, lat_weighted_mse, latitude_weights

    dev = torch.device("cuda")
    model = build_model("reslim", n_vars=3, history=2, n_const=0, n_out=3, img_size=(16, 32), patch_size=2,
                        embed_dim=64, depth=4, num_heads=4, split=(1, 2, 1), keep_ratio=0.25).to(dev)
    x, y = torch.randn(2, 6, 16, 32, device=dev), torch.randn(2, 3, 16, 32, device=dev)
    dtype = acc.autocast_dtype("auto", dev)
    with acc.autocast(dev, dtype):
        pred = model(x, generator=torch.Generator().manual_seed(0))
    loss = lat_weighted_mse(pred.float(), y, latitude_weights(torch.linspace(-80, 80, 16, device=dev)))
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in model.parameters() if p.requires_grad)
    assert acc.peak_memory_bytes(dev) > 0
