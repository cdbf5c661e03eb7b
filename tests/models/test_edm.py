"""Res-Slim-EDM: preconditioning, sigma -> 0, asymmetric sparse attention shapes, held routing, samplers, r = 1."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from wxray.models import (
    GENERATIVE_MODEL_NAMES,
    ResSlimEDM,
    RowGenerators,
    build_model,
    edm_loss,
    karras_sigmas,
    lat_weighted_mse,
    latitude_weights,
    loss_weight,
    precond,
    sample_heun,
    sample_stochastic,
)

B, N_VARS, HISTORY, N_CONST, N_OUT, IMG, PATCH = 2, 2, 2, 1, 2, (8, 16), 2
L = (IMG[0] // PATCH) * (IMG[1] // PATCH)  # 32 tokens
K = 8  # floor(0.25 * 32)


def gen(seed):
    return torch.Generator().manual_seed(seed)


def make(keep_ratio=0.25, seed=0, **kw):
    torch.manual_seed(seed)
    kw = {"split": (2, 4, 2), "sigma_data": 0.5, **kw}
    return ResSlimEDM(N_VARS, HISTORY, N_CONST, N_OUT, IMG, PATCH, 32, 8, 4, mlp_ratio=2.0,
                      keep_ratio=keep_ratio, skip_channels=8, **kw)


def data(seed=1):
    g = gen(seed)
    return torch.randn(B, N_OUT, *IMG, generator=g), torch.randn(B, N_VARS * HISTORY + N_CONST, *IMG, generator=g)


def test_preconditioning_matches_the_edm_definitions():
    sigma = torch.tensor([0.002, 0.05, 0.5, 1.0, 3.0, 80.0], dtype=torch.float64)
    for sd in (0.5, 1.0):
        c = precond(sigma, sd)
        assert torch.allclose(c.c_skip, sd**2 / (sigma**2 + sd**2))
        assert torch.allclose(c.c_out, sigma * sd / torch.sqrt(sigma**2 + sd**2))
        assert torch.allclose(c.c_in, 1 / torch.sqrt(sigma**2 + sd**2))
        assert torch.allclose(c.c_noise, torch.log(sigma) / 4)
        # EDM's design: unit-variance network input and effective target for Var(Y) = sd^2
        assert torch.allclose(c.c_in**2 * (sigma**2 + sd**2), torch.ones_like(sigma))
        target_var = ((1 - c.c_skip) ** 2 * sd**2 + c.c_skip**2 * sigma**2) / c.c_out**2
        assert torch.allclose(target_var, torch.ones_like(sigma))
        assert torch.allclose(loss_weight(sigma, sd), 1 / c.c_out**2)
    zero = precond(torch.zeros(1), 0.5)
    assert zero.c_skip.item() == 1.0 and zero.c_out.item() == 0.0 and torch.isfinite(zero.c_noise).all()


def test_denoiser_returns_its_input_as_sigma_goes_to_zero():
    model = make().eval()
    y, cond = data()
    routing = model.draw_routing(B, gen(0))
    assert torch.equal(model(y, 0.0, cond, routing=routing), y)
    errs = [(model(y, s, cond, routing=routing) - y).abs().max().item() for s in (1e-1, 1e-3, 1e-5)]
    assert errs[0] > errs[1] > errs[2] and errs[2] < 1e-4
    assert errs[0] > 1e-3  # the network does contribute at finite sigma


def test_sparse_stage_self_attention_sees_k_tokens_cross_attention_k_queries_against_l_keys(monkeypatch):
    model = make().eval()
    y, cond = data()
    seen = {}
    for i, block in enumerate(model.router.blocks):
        block.attn.register_forward_pre_hook(lambda m, a, i=i: seen.__setitem__((i, "self"), a[0].shape))
        block.cross_attn.register_forward_pre_hook(
            lambda m, a, i=i: seen.__setitem__((i, "cross"), (a[0].shape, a[1].shape))
        )
    sdpa_calls = []
    real_sdpa = F.scaled_dot_product_attention

    def sdpa(q, k, v, *args, **kwargs):
        if q.shape[2] > 1:  # the tokenizers' variable aggregation uses one query per position; skip it
            sdpa_calls.append((q.shape[2], k.shape[2], v.shape[2]))
        return real_sdpa(q, k, v, *args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", sdpa)
    model(y, 1.0, cond, routing=model.draw_routing(B, gen(0)))
    D = 32
    for i in range(8):
        n = K if 2 <= i < 6 else L
        assert seen[i, "self"] == (B, n, D)
        assert seen[i, "cross"] == ((B, n, D), (B, L, D))  # conditioning stays full length
    expected = [(L, L, L), (L, L, L)] * 2 + [(K, K, K), (K, L, L)] * 4 + [(L, L, L), (L, L, L)] * 2
    assert sdpa_calls == expected  # per block: self (Q, K, V lengths), then cross


def _record_routing(model):
    calls = []
    model.router.register_forward_hook(lambda m, a, out: calls.append(m.last_indices.clone()))
    return calls


def test_routing_is_held_across_denoising_steps_and_differs_across_samples():
    model = make().eval()
    _, cond = data()
    calls = _record_routing(model)
    sample_heun(model, cond, gen(0), steps=3)
    assert len(calls) == 5  # 2N - 1 denoiser calls
    assert all(torch.equal(c, calls[0]) for c in calls)
    assert calls[0].shape == (B, K) and not torch.equal(calls[0][0], calls[0][1])
    calls.clear()
    sample_stochastic(model, cond, gen(1), steps=3, s_churn=10.0)
    assert all(torch.equal(c, calls[0]) for c in calls)
    first = calls[0]
    calls.clear()
    sample_heun(model, cond, gen(2), steps=2)
    assert not torch.equal(calls[0], first)  # another trajectory, another selection
    # training: a fresh selection every forward
    calls.clear()
    y, cond = data()
    g = gen(3)
    model(y, 1.0, cond, generator=g), model(y, 1.0, cond, generator=g)
    assert not torch.equal(calls[0], calls[1])


def test_sampling_with_a_fixed_generator_is_reproducible():
    model = make().eval()
    _, cond = data()
    a, b = sample_heun(model, cond, gen(0), steps=4), sample_heun(model, cond, gen(0), steps=4)
    assert torch.equal(a, b) and a.shape == (B, N_OUT, *IMG) and torch.isfinite(a).all()
    assert not torch.equal(a, sample_heun(model, cond, gen(1), steps=4))
    kw = dict(steps=4, s_churn=20.0, s_min=0.01, s_max=50.0, s_noise=1.003)
    c, d = sample_stochastic(model, cond, gen(0), **kw), sample_stochastic(model, cond, gen(0), **kw)
    assert torch.equal(c, d)
    assert not torch.equal(c, a)  # churn draws extra noise
    assert torch.equal(sample_stochastic(model, cond, gen(0), steps=4), a)  # no churn: Algorithm 1


def test_with_row_generators_each_member_replays_alone():
    model = make().eval()
    _, cond = data()
    calls = _record_routing(model)
    kw = dict(steps=3, s_churn=10.0)
    batched = sample_stochastic(model, cond, RowGenerators.from_seeds([10, 11]), **kw)
    alone = sample_stochastic(model, cond[1:], RowGenerators.from_seeds([11]), **kw)
    assert torch.equal(calls[-1][0], calls[0][1])  # member 1's routing, drawn in a batch of 2 or alone
    assert torch.allclose(batched[1:], alone, rtol=1e-4, atol=1e-4)  # batch-size roundoff only, x_0 ~ 80
    assert not torch.allclose(batched[:1], alone, atol=1e-2)
    target, cond = data()
    lat_w = latitude_weights(torch.linspace(-78.75, 78.75, IMG[0]))
    one = edm_loss(model, target[1:], cond[1:], lat_w, RowGenerators.from_seeds([11]))
    both = edm_loss(model, target, cond, lat_w, RowGenerators.from_seeds([10, 11]))
    zero = edm_loss(model, target[:1], cond[:1], lat_w, RowGenerators.from_seeds([10]))
    assert torch.allclose(both, (one + zero) / 2, rtol=1e-5)


def test_keep_ratio_one_is_the_dense_edm_with_the_same_weights():
    sparse = make(keep_ratio=0.25)
    dense = make(keep_ratio=1.0, seed=5)
    dense.load_state_dict(sparse.state_dict())  # routing adds no parameters: same keys
    dense.eval()
    y, cond = data()
    sigma = torch.tensor([0.3, 4.0])
    # the dense EDM written out: every block on all L tokens
    c = [v.view(B, 1, 1, 1) for v in precond(sigma, dense.sigma_data)]
    x_in = c[2] * y
    emb, z_c = dense.noise_embed(c[3].view(B)), dense.condition(cond)
    z = dense.target_tokenizer(x_in) + dense.target_time
    for block in dense.router.blocks:
        z = block(z, cond=z_c, emb=emb)
    reference = c[0] * y + c[1] * (dense.decode(z) + dense.skip(x_in))
    assert torch.equal(dense(y, sigma, cond, generator=gen(0)), reference)
    assert dense.draw_routing(B, gen(0)) is None and dense.router.last_indices is None
    assert not torch.allclose(sparse.eval()(y, sigma, cond, generator=gen(0)), reference)


def test_edm_loss_draws_from_the_generator_and_weights_by_lambda():
    model = make().train()
    target, cond = data()
    lat_w = latitude_weights(torch.linspace(-78.75, 78.75, IMG[0]))
    loss = edm_loss(model, target, cond, lat_w, gen(7), p_mean=-1.2, p_std=1.2)
    assert torch.equal(loss, edm_loss(model, target, cond, lat_w, gen(7)))
    # the same draws by hand: ln sigma, then the noise, then the model's routing
    g = gen(7)
    sigma = (-1.2 + 1.2 * torch.randn(B, generator=g)).exp()
    noise = torch.randn(target.shape, generator=g)
    denoised = model(target + sigma.view(B, 1, 1, 1) * noise, sigma, cond, generator=g)
    per_sample = [lat_weighted_mse(denoised[b : b + 1], target[b : b + 1], lat_w) for b in range(B)]
    expected = sum(loss_weight(sigma[b], 0.5) * per_sample[b] for b in range(B)) / B
    assert torch.allclose(loss, expected, rtol=1e-5)
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())


def test_activation_checkpointing_same_outputs_and_grads():
    def run(checkpointing):
        model = make(dropout=0.1, drop_path=0.1).train()
        model.activation_checkpointing = checkpointing
        y, cond = data()
        out = model(y, 2.0, cond, generator=gen(4))
        out.square().mean().backward()
        return out, [p.grad for p in model.parameters()]

    (a, ga), (b, gb) = run(False), run(True)
    assert torch.equal(a, b)
    assert all(torch.allclose(x, z, atol=1e-7) for x, z in zip(ga, gb, strict=True))


def test_heun_integrates_the_probability_flow_ode_of_a_gaussian():
    # For Y ~ N(0, s^2) the ideal denoiser is D(y; t) = s^2 / (t^2 + s^2) y, and the ODE dx/dt = (x - D) / t
    # carries x(T) to x(0) = x(T) s / sqrt(T^2 + s^2): Heun must reproduce it, and churn must keep std s.
    s = 0.5

    class Ideal:
        n_out, img_size = 1, (64, 64)

        def draw_routing(self, batch, generator, device=None):
            return None

        def __call__(self, y, sigma, cond, generator=None, routing=None):
            return s**2 / (sigma**2 + s**2) * y

    cond = torch.zeros(4, 1, 64, 64)
    exact = 80.0 * torch.randn(4, 1, 64, 64, generator=gen(0)) * s / math.sqrt(80.0**2 + s**2)
    errs = [((sample_heun(Ideal(), cond, gen(0), steps=n) / exact) - 1).abs().max().item() for n in (16, 32, 64)]
    assert errs[2] < 5e-3
    assert 3.5 < errs[0] / errs[1] < 5 and 3.5 < errs[1] / errs[2] < 5  # second order: error ~ 1 / N^2
    churned = sample_stochastic(Ideal(), cond, gen(1), steps=128, s_churn=160.0, s_min=0.05, s_max=50.0)
    assert abs(churned.std().item() - s) < 0.01  # gamma at its cap sqrt(2) - 1 on most steps


def test_spread_gain_is_the_samplers_and_the_default_steps_keep_it_within_one_percent():
    """The discretisation's inflation of the spread: `spread_gain` equals the sampler's own on the exact
    denoiser of Gaussian data (exactly for Heun, whose steps are linear; within sampling error with churn),
    and the default schedule keeps it within 1% where EDM's 18 steps do not."""
    from wxray.models.edm_sampler import DEFAULT_STEPS, spread_gain

    for s in (0.05, 0.5):
        class Ideal:
            n_out, img_size = 1, (64, 64)

            def draw_routing(self, batch, generator, device=None):
                return None

            def __call__(self, y, sigma, cond, generator=None, routing=None, s=s):
                return s**2 / (sigma**2 + s**2) * y

        cond = torch.zeros(4, 1, 64, 64)
        x0 = 80.0 * torch.randn(4, 1, 64, 64, generator=gen(0))  # the sampler's first draw
        ratio = (sample_heun(Ideal(), cond, gen(0), steps=18) / x0).double()
        assert float(ratio.std() / ratio.mean()) < 1e-4  # one linear map (float32 round-off)
        assert float(ratio.mean()) * 80.0 / s == pytest.approx(spread_gain(s, steps=18), rel=1e-5)
        churn = dict(steps=18, s_churn=10.0)
        sample = sample_stochastic(Ideal(), cond, gen(1), **churn)
        assert float(sample.std()) / s == pytest.approx(spread_gain(s, **churn), abs=3 * (2 * sample.numel()) ** -0.5)
    spreads = np.geomspace(0.01, 3.0, 25)
    assert max(abs(spread_gain(s) - 1) for s in spreads) < 0.01 and DEFAULT_STEPS == 64
    assert min(spread_gain(s, steps=18) - 1 for s in spreads) > 0.03  # EDM's default: 3-16% too wide


def test_noise_levels_follow_the_karras_schedule():
    t = karras_sigmas(5, 0.002, 80.0, 7.0)
    assert t.shape == (6,) and t[-1] == 0
    assert math.isclose(t[0].item(), 80.0) and math.isclose(t[4].item(), 0.002)
    assert torch.all(t[1:] < t[:-1])
    mid = (80 ** (1 / 7) + 0.5 * (0.002 ** (1 / 7) - 80 ** (1 / 7))) ** 7
    assert math.isclose(karras_sigmas(3, 0.002, 80.0, 7.0)[1].item(), mid)


def test_build_model_and_validation():
    assert GENERATIVE_MODEL_NAMES == ("edm",)
    model = build_model("edm", n_vars=N_VARS, history=HISTORY, n_const=N_CONST, n_out=N_OUT, img_size=IMG,
                        patch_size=PATCH, embed_dim=32, depth=4, num_heads=4, keep_ratio=0.5, sigma_data=0.5)
    assert isinstance(model, ResSlimEDM) and model.num_routed == 16
    with pytest.raises(ValueError, match="random"):
        make(selection="laplacian")
    with pytest.raises(ValueError, match="sigma_data"):
        make(sigma_data=0.0)
    y, cond = data()
    sparse, dense = make(), make(keep_ratio=1.0)
    with pytest.raises(ValueError, match="dense model"):
        dense(y, 1.0, cond, routing=sparse.draw_routing(B, gen(0)))
    with pytest.raises(ValueError, match="routing must be"):
        sparse(y, 1.0, cond, routing=torch.zeros(B, K + 1, dtype=torch.long))
    with pytest.raises(ValueError, match="sorted, distinct"):
        sparse(y, 1.0, cond, routing=torch.zeros(B, K, dtype=torch.long))
    with pytest.raises(ValueError, match="sigma must be >= 0"):
        sparse(y, -1.0, cond)
    with pytest.raises(ValueError, match="cond"):
        sparse(y, 1.0, cond[:, :-1])


def test_local_condition_adds_each_locations_history_to_its_token():
    """local_condition: Z_x + Z_c token by token, no new parameters; a change of the conditioning at one
    location moves that location's output through the tokens even with the cross-attention switched off."""
    plain, local = make(seed=3).eval(), make(seed=3, local_condition=True).eval()
    assert plain.state_dict().keys() == local.state_dict().keys()
    for m in (plain, local):
        for block in m.router.blocks:
            torch.nn.init.zeros_(block.cross_attn.proj.weight)
            torch.nn.init.zeros_(block.cross_attn.proj.bias)
    y, cond = data()
    other = cond.clone()
    other[:, :, :PATCH, :PATCH] += 3.0  # the history of the first token only
    routing = plain.draw_routing(B, gen(4))
    with torch.no_grad():
        moved = [(m(y, 2.0, other, routing=routing) - m(y, 2.0, cond, routing=routing)).abs().amax().item()
                 for m in (plain, local)]
    assert moved[0] == 0.0 and moved[1] > 0.0
