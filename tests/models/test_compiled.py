"""torch.compile of every registered model and end-to-end stage module: the same numbers as eager, random draws
included (models/compiled.py).

Dynamo's graphs and AOT autograd are what fail on a model (graph breaks that cannot be split, data-dependent
shapes, mutated state); Inductor's code generation is the slow part on a CPU (a minute for the tiny model on two
cores) and is exercised on the GPU by benchmarks/gpu.sh. So these tests compile with backend="aot_eager".
"""

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from tests.models.test_e2e_models import LAT, LON, make_encoder, make_obs
from wxray.models import EDMForecaster, StationDecoder, StochasticEncoder, edm_loss, lat_weighted_mse
from wxray.models.blocks import RowGenerators
from wxray.models.compiled import compile_mode, compile_module, host_checks, mode_for
from wxray.models.registry import MODELS, build_model


def _kwargs(tiny_kwargs, name):
    extra = {"drop_path": 0.1} if name == "droppath" else {"keep_ratio": 0.25, "dropout": 0.1}
    if name == "edm":
        extra = {"keep_ratio": 0.25}
    return {**tiny_kwargs, "depth": 3, "split": (1, 1, 1), **extra}


def _step(model, name, x, lat_w):
    """One training forward + backward from a fixed generator: (loss, gradients, the generator's end state)."""
    g = torch.Generator().manual_seed(7)
    model.zero_grad(set_to_none=True)
    if name == "edm":
        loss = edm_loss(model, x[:, :3], x, lat_w, g)
    else:
        loss = lat_weighted_mse(model(x, generator=g), x[:, :3], lat_w)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None], g.get_state()


def _assert_same_step(eager, compiled):
    """(output or loss, gradients, the generator's end state) of an eager and a compiled step: the same numbers,
    the same draws in the same order."""
    assert torch.equal(eager[0], compiled[0]) and torch.equal(eager[2], compiled[2])
    assert len(eager[1]) == len(compiled[1]) > 0
    for a, b in zip(eager[1], compiled[1]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n if n == "reslim" else pytest.param(n, marks=pytest.mark.slow) for n in MODELS])
def test_every_model_trains_compiled_with_the_eager_numbers(name, tiny_kwargs, tiny_input):
    torch.manual_seed(0)
    kwargs = _kwargs(tiny_kwargs, name)
    if name == "edm":
        kwargs["n_vars"], kwargs["n_out"] = 3, 3
    model = build_model(name, **kwargs).train()
    x = tiny_input[:, :7] if name != "edm" else tiny_input
    if name == "edm":  # the denoiser's conditioning: its own input layout
        x = torch.randn(2, model.cond_channels, 16, 32, generator=torch.Generator().manual_seed(1))
    lat_w = torch.ones(16)
    eager = _step(model, name, x, lat_w)
    compiled = _step(compile_module(model, "default", backend="aot_eager"), name, x, lat_w)
    _assert_same_step(eager, compiled)


def test_compiled_sampler_call_matches_and_compiles_once_for_all_noise_levels(tiny_kwargs):
    torch.manual_seed(0)
    denoiser = build_model("edm", **_kwargs(tiny_kwargs, "edm")).eval()
    cond = torch.randn(4, denoiser.cond_channels, 16, 32, generator=torch.Generator().manual_seed(2))
    counted = CompileCounterWithBackend("aot_eager")  # counts the graphs Dynamo compiles
    module = compile_module(denoiser, "default", backend=counted)
    eager, compiled = EDMForecaster(denoiser, steps=6), EDMForecaster(module, steps=6)
    with torch.no_grad():
        EDMForecaster(module, steps=1)(cond, generator=RowGenerators.from_seeds(range(4)))  # one denoiser call
        graphs = counted.frame_count
        a = eager(cond, generator=RowGenerators.from_seeds(range(4)))
        b = compiled(cond, generator=RowGenerators.from_seeds(range(4)))
        c = compiled(cond, generator=RowGenerators.from_seeds(range(4)))
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert torch.equal(b, c)
    # the 11 denoiser calls at 6 noise levels (Euler and Heun steps) reuse the first call's graphs: no recompile
    assert graphs > 0 and counted.frame_count == graphs


def test_modes_and_their_fallback_off_cuda():
    assert compile_mode(True) == "default" and compile_mode(False) == "off"
    assert mode_for("default", "cpu") == ("default", None)
    mode, line = mode_for("reduce-overhead", "cpu")
    assert mode == "default" and "CUDA graphs need a CUDA device" in line and "\n" not in line
    assert mode_for("max-autotune", "cpu")[0] == "max-autotune-no-cudagraphs"
    with pytest.raises(ValueError, match="compile mode must be one of"):
        compile_mode("fast")
    model = torch.nn.Linear(2, 2)
    assert compile_module(model, "off") is model
    said = []
    wrapped = compile_module(model, "reduce-overhead", "cpu", backend="aot_eager", say=said.append)
    assert wrapped is not model and wrapped.weight is model.weight
    assert len(said) == 2 and said[0].startswith("compile=reduce-overhead: CUDA graphs need a CUDA device")
    assert said[1] == "compile: torch.compile of Linear, backend=aot_eager (compiles at its first call)"
    assert host_checks(torch.zeros(1))


@pytest.mark.slow  # about 10 s of tracing on 2 cores: make test, not test-fast
def test_the_sparse_model_trains_compiled_under_bf16_autocast_as_eager_does(tiny_kwargs, tiny_input):
    """train.precision=bf16 runs the forward under autocast (platform/cluster/devices.compute): the compiled
    sparse stage (gather, blocks on the kept tokens, scatter of the delta) gives eager's bf16 numbers."""
    torch.manual_seed(0)
    model = build_model("reslim", **_kwargs(tiny_kwargs, "reslim")).train()
    x, lat_w = tiny_input[:, :7], torch.ones(16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        eager = _step(model, "reslim", x, lat_w)
        compiled = _step(compile_module(model, "default", backend="aot_eager"), "reslim", x, lat_w)
    _assert_same_step(eager, compiled)
    assert eager[0].dtype == torch.float32  # autocast's loss is fp32
    assert all(a.dtype == b.dtype == torch.float32 for a, b in zip(eager[1], compiled[1]))  # fp32 gradients


def _trained_alike(model, call):
    """(output, gradients, the generator's end state) of one backward through `call(module, generator)`, eager
    and compiled: both on `model`'s own parameters."""
    runs = []
    for module in (model, compile_module(model, "default", backend="aot_eager")):
        model.zero_grad(set_to_none=True)
        g = torch.Generator().manual_seed(7)
        y = call(module, g)
        y.square().mean().backward()
        runs.append((y.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None], g.get_state()))
    return runs


@pytest.mark.slow  # tracing on 2 cores: make test, not test-fast (test-fast keeps the sparse model and the sampler)
@pytest.mark.parametrize("stage", ["encoder", "stochastic encoder", "decoder"])
def test_the_end_to_end_stage_modules_train_compiled_with_the_eager_numbers(stage):
    """The end-to-end stages of the loop (forecast/stages.py) compile too: the SetConv encoder with its dropout,
    the noise-conditioned encoder with its members, the station decoder (at another station count the compiled
    module recompiles and still agrees)."""
    obs, static = make_obs(), torch.randn(2, 2, 16, 32, generator=torch.Generator().manual_seed(3))
    if stage == "encoder":
        model, call = make_encoder(dropout=0.1).train(), lambda m, g: m(obs, static, generator=g)
    elif stage == "stochastic encoder":
        model = StochasticEncoder(make_encoder(dropout=0.1), "film").train()
        call = lambda m, g: m(obs, static, generator=g, noise_generator=torch.Generator().manual_seed(9),  # noqa: E731
                              members=2)
    else:
        torch.manual_seed(0)
        model = StationDecoder(4, 3, LAT, LON, hidden=8, n_features=1)
        g = torch.Generator().manual_seed(4)
        state, feats = torch.randn(2, 4, 16, 32, generator=g), torch.randn(2, 30, 1, generator=g)
        coords = torch.stack([torch.rand(2, 30, generator=g) * 160 - 80, torch.rand(2, 30, generator=g) * 360], -1)
        call = lambda m, g: m(state, coords, feats)  # noqa: E731
    _assert_same_step(*_trained_alike(model, call))
    if stage == "decoder":
        compiled = compile_module(model, "default", backend="aot_eager")
        compiled(state, coords, feats)
        fewer = (state, coords[:, :17], feats[:, :17])
        assert torch.equal(model(*fewer), compiled(*fewer))
