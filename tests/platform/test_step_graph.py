"""train.cuda_graphs (platform/train/step_graph.py): the train keys that ask for it, why a run is not captured,
the learning rate as a device tensor, and on a GPU the captured step itself (gpu-marked: benchmarks/gpu.sh runs
them)."""

from __future__ import annotations

import pytest
import torch

from wxray.config import from_dict, parse_override
from wxray.errors import ConfigError
from wxray.models import ResSlimViT, lat_weighted_mse
from wxray.models.compiled import compile_module
from wxray.platform.train.config import TrainSparseConfig
from wxray.platform.train.step_graph import (
    WARMUP_STEPS,
    StepGraph,
    capturable_adamw,
    match_capture,
    set_lr,
    why_not_captured,
)


def test_why_a_run_is_not_captured_is_one_line_each():
    assert "need a CUDA device, the steps run uncaptured on cpu" in why_not_captured(torch.device("cpu"), 1, False)
    cuda = torch.device("cuda", 0)
    assert why_not_captured(cuda, 1, False) is None
    assert "gradient collectives of 4 workers" in why_not_captured(cuda, 4, False)
    assert "activation checkpointing" in why_not_captured(cuda, 1, True)
    assert all("\n" not in why_not_captured(d, w, a) for d, w, a in
               [(torch.device("cpu"), 1, False), (cuda, 2, False), (cuda, 1, True)])


def test_set_lr_writes_floats_and_device_tensors_alike():
    p = torch.nn.Parameter(torch.zeros(2))
    plain = torch.optim.AdamW([p], lr=1e-3)
    set_lr(plain, 5e-4)
    assert plain.param_groups[0]["lr"] == 5e-4
    held = torch.optim.AdamW([p], lr=torch.tensor(1e-3))
    lr = held.param_groups[0]["lr"]
    set_lr(held, 2e-4)
    assert held.param_groups[0]["lr"] is lr and lr.item() == pytest.approx(2e-4)  # in place: a graph reads it


def _stepped_state(lr):
    p = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.AdamW([p], lr=1e-3)
    p.grad = torch.ones(2)
    opt.step()
    sd = opt.state_dict()
    sd["param_groups"][0]["lr"] = lr
    return p, sd


def test_a_resumed_optimizer_takes_this_runs_capture_settings_not_the_checkpoints():
    # a captured run's checkpoint (capturable, lr a tensor, loaded onto the CPU) resumed uncaptured: a float lr
    # the schedule can set, and a step that runs on the CPU (capturable=True there raises)
    p, sd = _stepped_state(torch.tensor(3e-4))
    sd["param_groups"][0]["capturable"] = True
    opt = torch.optim.AdamW([p], lr=1e-3)
    opt.load_state_dict(sd)
    match_capture(opt, False, torch.device("cpu"))
    group = opt.param_groups[0]
    assert group["lr"] == pytest.approx(3e-4) and not torch.is_tensor(group["lr"]) and group["capturable"] is False
    p.grad = torch.ones(2)
    opt.step()
    assert opt.state[p]["step"].item() == 2.0 and opt.state[p]["step"].device.type == "cpu"


@pytest.mark.gpu
def test_an_eager_checkpoint_resumed_captured_gets_a_device_lr_and_device_steps():
    device = torch.device("cuda", 0)
    p, sd = _stepped_state(2e-4)
    p = torch.nn.Parameter(p.detach().to(device))
    opt = capturable_adamw([p], 1e-3, device)
    opt.load_state_dict(sd)
    match_capture(opt, True, device)
    group = opt.param_groups[0]
    assert torch.is_tensor(group["lr"]) and group["lr"].is_cuda and group["capturable"] is True
    assert group["lr"].item() == pytest.approx(2e-4) and opt.state[p]["step"].is_cuda


def _tiny(device, keep=0.25, dropout=0.1):
    torch.manual_seed(0)
    return ResSlimViT(3, 2, 1, 3, (16, 32), 2, 32, 4, 4, 4.0, (1, 2, 1), keep, dropout=dropout).to(device).train()


@pytest.mark.gpu
def test_the_captured_step_trains_replays_and_runs_other_shapes_eagerly():
    device = torch.device("cuda", 0)
    model = _tiny(device)
    opt = capturable_adamw(list(model.parameters()), 1e-3, device)
    lat_w = torch.ones(16, device=device)

    def step(batch, w, gen):
        loss = lat_weighted_mse(model(batch["x"], generator=gen).float(), batch["y"], lat_w) * w
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.detach(), None

    said: list[str] = []
    graph = StepGraph(step, opt, device, say=said.append)
    graph.reseed(3)
    gen = torch.Generator(device=device).manual_seed(0)
    batch = {"x": torch.randn(4, 7, 16, 32, device=device, generator=gen),
             "y": torch.randn(4, 3, 16, 32, device=device, generator=gen)}
    losses = []
    for _ in range(40):
        before = next(model.parameters()).detach().clone()
        set_lr(opt, 1e-3)
        losses.append(graph(batch, 1.0)[0].item())
        assert not torch.equal(before, next(model.parameters()))  # every call, replays included, steps the weights
    assert graph.captured and not graph.failed and len(said) == 1 and "is captured" in said[0]
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < 0.8 * losses[0], losses
    zero = [graph(batch, 0.0)[0].item() for _ in range(2)]  # weight 0: a dummy lockstep batch's loss
    assert zero == [0.0, 0.0]
    # the learning rate reaches the replays: at 0 the weights stay; the draws advance on every replay, and a
    # reseed draws them again
    set_lr(opt, 0.0)
    before = [q.detach().clone() for q in model.parameters()]
    graph.reseed(5)
    first = [graph(batch, 1.0)[0].item() for _ in range(2)]
    graph.reseed(5)
    again = [graph(batch, 1.0)[0].item() for _ in range(2)]
    assert all(torch.equal(b, q) for b, q in zip(before, model.parameters(), strict=True))
    assert first[0] != first[1] and first == again, (first, again)
    set_lr(opt, 1e-3)
    small = {k: v[:2].clone() for k, v in batch.items()}  # an epoch's last, smaller batch: eager, same weights
    loss_small = graph(small, 1.0)[0]
    assert torch.isfinite(loss_small) and graph.captured
    assert len(said) == 2 and "another shape than the first" in said[1], said
    graph(small, 1.0)
    assert len(said) == 2  # said once
    assert torch.isfinite(graph(batch, 1.0)[0])  # and the graph replays again after it
    assert WARMUP_STEPS >= 1


@pytest.mark.gpu
def test_reduce_overhead_training_matches_eager_on_a_dense_model():
    device = torch.device("cuda", 0)
    x = torch.randn(4, 7, 16, 32, device=device)
    y = torch.randn(4, 3, 16, 32, device=device)
    lat_w = torch.ones(16, device=device)
    losses = {}
    for mode in ("off", "reduce-overhead"):
        model = _tiny(device, keep=1.0, dropout=0.0)  # no draws: both modes compute the same function
        run = compile_module(model, mode, device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        out = []
        for _ in range(6):
            opt.zero_grad(set_to_none=True)
            loss = lat_weighted_mse(run(x).float(), y, lat_w)
            loss.backward()
            opt.step()
            out.append(loss.item())
        losses[mode] = out
    torch.testing.assert_close(torch.tensor(losses["reduce-overhead"]), torch.tensor(losses["off"]),
                               rtol=1e-3, atol=1e-4)


def test_train_keys_take_modes_and_refuse_two_captures():
    assert from_dict(TrainSparseConfig, parse_override("train.compile=true")).train.compile == "default"
    assert from_dict(TrainSparseConfig, parse_override("train.compile=max-autotune")).train.compile == "max-autotune"
    with pytest.raises(ConfigError, match="'train.compile' expects 'off', 'default'"):
        from_dict(TrainSparseConfig, parse_override("train.compile=fast"))
    with pytest.raises(ConfigError, match="train.cuda_graphs captures the whole step"):
        from_dict(TrainSparseConfig, {"train": {"compile": "reduce-overhead", "cuda_graphs": True}})
