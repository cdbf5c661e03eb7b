"""Stochastic uplift, model side: FiLM warm start, noise-conditioned encoder, members as a batch dim, MC dropout,
the fair-CRPS training loss (against `scores`), and the one-line errors on bad input."""

import copy
import io

import numpy as np
import pytest
import torch
import torch.nn as nn
import xarray as xr
from scores.probability import crps_for_ensemble

from wxray.models import (
    Dropout,
    DropPath,
    FiLMLayerNorm,
    ObsEncoder,
    ResSlimViT,
    RowGenerators,
    StochasticEncoder,
    StreamInput,
    condition_layernorms,
    fair_crps_loss,
    latitude_weights,
    mc_dropout,
    set_dropout,
    split_members,
    tile_members,
)

H, W = 8, 16
LAT = torch.linspace(-78.75, 78.75, H)
LON = torch.arange(W) * 360.0 / W
STREAMS = [StreamInput("stations", "points_to_grid", 2)]


def make_encoder(dropout=0.0):
    torch.manual_seed(0)
    return ObsEncoder(STREAMS, LAT, LON, n_static=1, n_out=3, hidden=8, embed_dim=32, depth=2, num_heads=4,
                      dropout=dropout).eval()


def make_inputs(b=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    n = 30
    coords = torch.stack([torch.rand(b, n, generator=g) * 160 - 80, torch.rand(b, n, generator=g) * 360], -1)
    obs = {
        "obs.stations.coords": coords,
        "obs.stations.values": torch.randn(b, n, 2, generator=g),
        "obs.stations.mask": torch.ones(b, n, 2),
    }
    return obs, torch.randn(b, 1, H, W, generator=g)


def trained_like(se: StochasticEncoder) -> StochasticEncoder:
    """Give the zero-initialised noise pathway non-zero weights, as finetuning would."""
    torch.manual_seed(1)
    with torch.no_grad():
        for m in se.modules():
            if isinstance(m, FiLMLayerNorm):
                for lin in (m.scale, m.shift):
                    lin.weight.normal_(0.0, 0.1)
        if se.noise == "embed":
            se.noise_mlp[-1].weight.normal_(0.0, 0.1)
    return se


def seeds(b, members, offset=0):
    return [1000 * i + m + offset for i in range(b) for m in range(members)]


# ---------------------------------------------------------------- FiLM warm start


def test_film_layernorm_at_init_is_the_pretrained_norm_bit_for_bit_and_keeps_its_keys():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16))
    with torch.no_grad():
        model[1].weight.normal_()
        model[1].bias.normal_()
    before = copy.deepcopy(model)
    weight = model[1].weight
    cond = condition_layernorms(model, cond_dim=5)
    assert isinstance(model[1], FiLMLayerNorm) and model[1].weight is weight  # the pretrained Parameter itself
    x = torch.randn(3, 7, 8)
    cond.value = torch.randn(3, 7, 5) * 10
    assert torch.equal(model(x), before(x))
    cond.value = torch.randn(3, 1, 5)  # per-sample conditioning broadcasts over tokens
    assert torch.equal(model(x), before(x))
    # the pretrained keys do not move: a deterministic checkpoint loads with only the FiLM keys missing
    missing = model.load_state_dict(before.state_dict(), strict=False).missing_keys
    assert sorted(missing) == ["1.scale.bias", "1.scale.weight", "1.shift.bias", "1.shift.weight"]
    with torch.no_grad():
        model[1].scale.weight.normal_()
    assert not torch.equal(model(x), before(x))


@pytest.mark.parametrize("noise", ["film", "embed"])
def test_stochastic_encoder_at_init_equals_the_deterministic_encoder_exactly(noise):
    enc = make_encoder()
    obs, static = make_inputs()
    ref = enc(obs, static)
    se = StochasticEncoder(copy.deepcopy(enc), noise).eval()
    for seed in (0, 1):
        y = se(obs, static, noise_generator=torch.Generator().manual_seed(seed))
        assert torch.equal(y, ref)
    y = se(obs, static, noise_generator=torch.Generator().manual_seed(2), members=3)
    assert y.shape == (6, 3, H, W)
    assert torch.equal(split_members(y, 3), ref[:, None].expand(2, 3, 3, H, W))
    if noise == "film":
        n_film = sum(isinstance(m, FiLMLayerNorm) for m in se.modules())
        assert n_film == 2 * 2 + 1  # two per block (depth 2) and the final norm


def test_a_film_encoder_copies_and_pickles_after_a_training_forward():
    se = StochasticEncoder(make_encoder(), "film")
    obs, static = make_inputs()
    y = se(obs, static, noise_generator=torch.Generator().manual_seed(0))
    assert se.conditioning.value.requires_grad  # the graph tensor deepcopy would refuse
    twin = copy.deepcopy(se)
    holders = {id(m.conditioning) for m in twin.modules() if isinstance(m, FiLMLayerNorm)}
    assert holders == {id(twin.conditioning)} and twin.conditioning is not se.conditioning
    buf = io.BytesIO()
    torch.save(se, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    for other in (twin, loaded):
        torch.testing.assert_close(other(obs, static, noise_generator=torch.Generator().manual_seed(0)), y)


# ---------------------------------------------------------------- draws and members


@pytest.mark.parametrize("noise", ["film", "embed"])
def test_same_generator_state_same_members_other_draws_differ(noise):
    se = trained_like(StochasticEncoder(make_encoder(), noise)).eval()
    obs, static = make_inputs()
    with torch.no_grad():
        a = se(obs, static, noise_generator=torch.Generator().manual_seed(5), members=4)
        b = se(obs, static, noise_generator=torch.Generator().manual_seed(5), members=4)
        c = se(obs, static, noise_generator=torch.Generator().manual_seed(6), members=4)
    assert torch.equal(a, b)
    assert not torch.allclose(a, c)
    members = split_members(a, 4)
    for i in range(2):  # the members of one sample differ pairwise
        for m in range(1, 4):
            assert (members[i, m] - members[i, 0]).abs().max() > 1e-4


@pytest.mark.parametrize("noise", ["film", "embed"])
def test_batch_times_members_forward_equals_separate_forwards(noise):
    se = trained_like(StochasticEncoder(make_encoder(), noise)).eval()
    obs, static = make_inputs(b=2)
    M = 3
    with torch.no_grad():
        batched = split_members(se(obs, static, noise_generator=RowGenerators.from_seeds(seeds(2, M)), members=M), M)
        for m in range(M):
            gens = RowGenerators.from_seeds([1000 * i + m for i in range(2)])
            alone = se(obs, static, noise_generator=gens)
            torch.testing.assert_close(batched[:, m], alone, rtol=1e-5, atol=1e-6)
        # explicit draws do the same
        a = se.draw_noise(2 * M, torch.Generator().manual_seed(3))
        full = split_members(se(obs, static, members=M, noise=a), M)
        for m in range(M):
            torch.testing.assert_close(full[:, m], se(obs, static, noise=a[m::M]), rtol=1e-5, atol=1e-6)


def test_film_trains_from_the_warm_start_and_survives_activation_checkpointing():
    obs, static = make_inputs()
    target = torch.randn(2, 3, H, W)
    lat_w = latitude_weights(LAT)
    grads = []
    for ckpt in (False, True):
        se = StochasticEncoder(make_encoder(), "film")
        se.encoder.backbone.activation_checkpointing = ckpt
        y = se(obs, static, noise_generator=torch.Generator().manual_seed(0), members=3)
        fair_crps_loss(split_members(y, 3), target, 1, lat_w).backward()
        grads.append({n: p.grad.clone() for n, p in se.named_parameters() if p.grad is not None})
    # the zero-initialised FiLM projections get a gradient at once (their input is the noise embedding)
    assert grads[0]["encoder.backbone.router.blocks.0.norm1.scale.weight"].abs().sum() > 0
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], rtol=1e-5, atol=1e-7)


# ---------------------------------------------------------------- MC dropout processor


@pytest.fixture
def processor(tiny_kwargs):
    torch.manual_seed(0)
    return ResSlimViT(**tiny_kwargs, dropout=0.1)


def test_mc_dropout_keeps_only_dropout_active(processor):
    mc_dropout(processor)
    assert not processor.training
    for m in processor.modules():
        assert m.training == isinstance(m, (Dropout, DropPath))


def test_dropout_members_differ_reproduce_and_are_redrawn_every_call(processor, tiny_input):
    mc_dropout(processor)
    N = 3
    x = tile_members(tiny_input, N)
    with torch.no_grad():
        gens = RowGenerators.from_seeds(seeds(2, N))
        y1 = processor(x, generator=gens)
        y2 = processor(x, generator=gens)  # the generators advanced: the next lead step's masks
        again = processor(x, generator=RowGenerators.from_seeds(seeds(2, N)))
        one = processor(x, generator=torch.Generator().manual_seed(4))
        one_again = processor(x, generator=torch.Generator().manual_seed(4))
    assert torch.equal(y1, again) and torch.equal(one, one_again)
    assert not torch.allclose(y1, y2)
    for ens in (split_members(y1, N), split_members(one, N)):
        for i in range(2):
            for n in range(1, N):
                assert (ens[i, n] - ens[i, 0]).abs().max() > 1e-4


@pytest.mark.parametrize("keep_ratio", [1.0, 0.5])
def test_a_dropout_member_is_reproducible_on_its_own(tiny_kwargs, tiny_input, keep_ratio):
    torch.manual_seed(0)
    proc = mc_dropout(ResSlimViT(**{**tiny_kwargs, "keep_ratio": keep_ratio}, dropout=0.1))
    N = 2
    with torch.no_grad():
        batched = split_members(proc(tile_members(tiny_input, N), generator=RowGenerators.from_seeds(seeds(2, N))), N)
        for i in range(2):
            for n in range(N):
                alone = proc(tiny_input[i : i + 1], generator=RowGenerators.from_seeds([1000 * i + n]))
                torch.testing.assert_close(batched[i, n], alone[0], rtol=1e-5, atol=1e-6)


def test_dropout_members_identical_with_p_zero(processor, tiny_input):
    mc_dropout(processor, p=0.0)
    with torch.no_grad():
        y = split_members(processor(tile_members(tiny_input, 3), generator=RowGenerators.from_seeds(seeds(2, 3))), 3)
        ref = processor.eval()(tiny_input)
    for n in range(3):
        assert torch.equal(y[:, n], ref)


def test_row_generators_replay_under_activation_checkpointing(processor, tiny_input):
    processor.train()
    x = tile_members(tiny_input, 2)
    outs = []
    for ckpt in (False, True):
        processor.zero_grad()
        processor.activation_checkpointing = ckpt
        y = processor(x, generator=RowGenerators.from_seeds(seeds(2, 2)))
        y.square().mean().backward()
        outs.append((y.detach(), processor.head[0].weight.grad.clone()))
    assert torch.equal(outs[0][0], outs[1][0])
    torch.testing.assert_close(outs[0][1], outs[1][1])


# ---------------------------------------------------------------- fair CRPS loss


def _scores_loss(ens, target, lat_w, var_w, method):
    dims = ["b", "var", "lat", "lon"]
    per_var = crps_for_ensemble(
        xr.DataArray(ens, dims=["b", "member", *dims[1:]]),
        xr.DataArray(target, dims=dims),
        "member",
        method=method,
        weights=xr.DataArray(lat_w, dims=["lat"]),
        preserve_dims=["var"],
    )
    return float((per_var.values * var_w).mean())


def test_fair_crps_loss_equals_scores():
    rng = np.random.default_rng(0)
    ens, target = rng.normal(size=(2, 5, 3, H, W)), rng.normal(size=(2, 3, H, W))
    lat_w = latitude_weights(LAT.double()).numpy()
    var_w = np.array([1.0, 0.5, 2.0])
    args = (torch.tensor(ens), torch.tensor(target), 1, torch.tensor(lat_w))
    fair = _scores_loss(ens, target, lat_w, var_w, "fair")
    ecdf = _scores_loss(ens, target, lat_w, var_w, "ecdf")
    np.testing.assert_allclose(fair_crps_loss(*args, torch.tensor(var_w)).item(), fair, rtol=1e-10)
    np.testing.assert_allclose(fair_crps_loss(*args, torch.tensor(var_w), alpha=0.0).item(), ecdf, rtol=1e-10)
    # "almost fair" is the linear blend, as in anemoi-core's AlmostFairKernelCRPS
    np.testing.assert_allclose(
        fair_crps_loss(*args, torch.tensor(var_w), alpha=0.95).item(), 0.95 * fair + 0.05 * ecdf, rtol=1e-10
    )
    # no var_weights = all ones; the member dim may sit anywhere
    np.testing.assert_allclose(
        fair_crps_loss(torch.tensor(ens).movedim(1, 0), torch.tensor(target), 0, torch.tensor(lat_w)).item(),
        _scores_loss(ens, target, lat_w, np.ones(3), "fair"), rtol=1e-10,
    )


@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_fair_crps_loss_gradient_matches_finite_differences(alpha):
    g = torch.Generator().manual_seed(0)
    ens = torch.randn(2, 4, 2, 3, 4, dtype=torch.float64, generator=g, requires_grad=True)
    target = torch.randn(2, 2, 3, 4, dtype=torch.float64, generator=g)
    lat_w = latitude_weights(torch.tensor([-45.0, 0.0, 45.0], dtype=torch.float64))
    var_w = torch.tensor([1.0, 3.0], dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda e: fair_crps_loss(e, target, 1, lat_w, var_w, alpha), (ens,))


# ---------------------------------------------------------------- bad input: one-line ValueErrors


def _one_line(excinfo):
    assert "\n" not in str(excinfo.value)


def test_bad_input_raises_one_line_value_errors(processor):
    target = torch.zeros(1, 2, 3, 4)
    with pytest.raises(ValueError, match="at least 2 ensemble members") as e:
        fair_crps_loss(torch.zeros(1, 1, 2, 3, 4), target, 1, torch.ones(3))
    _one_line(e)
    with pytest.raises(ValueError, match="alpha") as e:
        fair_crps_loss(torch.zeros(1, 2, 2, 3, 4), target, 1, torch.ones(3), alpha=1.5)
    _one_line(e)
    with pytest.raises(ValueError, match="member dim") as e:
        fair_crps_loss(torch.zeros(2, 2, 3, 4), target, 1, torch.ones(3))
    _one_line(e)
    with pytest.raises(ValueError, match="noise must be one of film, embed") as e:
        StochasticEncoder(make_encoder(), "gaussian")
    _one_line(e)
    with pytest.raises(ValueError, match="noise_dim") as e:
        StochasticEncoder(make_encoder(), "embed", noise_dim=0)
    _one_line(e)

    no_norms = make_encoder()
    no_norms.backbone.norm = nn.Identity()
    for block in no_norms.backbone.router.blocks:
        block.norm1, block.norm2 = nn.Identity(), nn.Identity()
    with pytest.raises(ValueError, match="noise=film needs LayerNorms") as e:
        StochasticEncoder(no_norms, "film")
    _one_line(e)
    StochasticEncoder(no_norms, "embed")  # the embedding variant needs none
    with pytest.raises(ValueError, match="noise=film needs LayerNorms"):
        condition_layernorms(nn.Sequential(nn.Linear(3, 3)), 4)
    film = StochasticEncoder(make_encoder(), "film")
    with pytest.raises(ValueError, match="already FiLM-conditioned"):
        condition_layernorms(film.encoder, 4)

    for p in (1.0, -0.1, 1.5):
        with pytest.raises(ValueError, match=r"dropout p must be in \[0, 1\)") as e:
            mc_dropout(processor, p=p)
        _one_line(e)
        with pytest.raises(ValueError, match=r"dropout p must be in \[0, 1\)"):
            set_dropout(processor, p)
    with pytest.raises(ValueError, match="no wxray Dropout"):
        set_dropout(nn.Linear(2, 2), 0.1)

    obs, static = make_inputs()
    with pytest.raises(ValueError, match="members must be >= 1"):
        film(obs, static, members=0)
    with pytest.raises(ValueError, match="noise must be"):
        film(obs, static, members=2, noise=torch.zeros(2, film.n_tokens, film.noise_dim))
    with pytest.raises(ValueError, match="rows must match"):
        film(obs, static, members=2, noise_generator=RowGenerators.from_seeds([0, 1, 2]))
    with pytest.raises(ValueError, match="do not split"):
        split_members(torch.zeros(5, 2), 2)
