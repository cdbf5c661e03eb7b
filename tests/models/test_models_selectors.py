"""Selection strategies as the paper defines them: field scores (laplacian, gradient) and the learned head's BCE."""

import math

import pytest
import torch

from wxray.models import (
    GradientSelector,
    LaplacianSelector,
    LearnedSelector,
    RoutingContext,
    build_model,
    latitude_weights,
    per_patch_error,
    selector_loss,
)


def gen(seed):
    return torch.Generator().manual_seed(seed)


def smooth_fields(B=2, n_dyn=3, n_const=1, h=8, w=16, seed=0):
    """Large-scale waves (periodic in longitude) plus a little noise, and random constant fields."""
    g = gen(seed)
    lon = torch.arange(w) * 2 * math.pi / w
    lat = torch.linspace(-1.2, 1.2, h)
    phase = torch.rand(B, n_dyn, 1, 1, generator=g) * 2 * math.pi
    waves = 10 * torch.sin(lon + phase) * torch.cos(lat)[:, None] + 1000
    dyn = waves + 0.05 * torch.randn(B, n_dyn, h, w, generator=g)
    return torch.cat([dyn, torch.rand(B, n_const, h, w, generator=g)], dim=1)


@pytest.mark.parametrize("selector", [LaplacianSelector(), GradientSelector()])
def test_field_scores_are_periodic_in_longitude(selector):
    fields, grid, p = smooth_fields(), (4, 8), 2
    x = torch.zeros(2, 32, 8)
    ctx = RoutingContext(fields=fields, grid=grid, n_dynamic=3)
    scores = selector.score(x, ctx).view(2, *grid)
    for m in (1, 3, 7):
        rolled = RoutingContext(fields=fields.roll(m * p, dims=-1), grid=grid, n_dynamic=3)
        torch.testing.assert_close(selector.score(x, rolled).view(2, *grid), scores.roll(m, dims=-1))


@pytest.mark.parametrize("selector", [LaplacianSelector(), GradientSelector()])
def test_constant_fields_do_not_change_the_score(selector):
    fields = smooth_fields()
    x = torch.zeros(2, 32, 8)
    other = fields.clone()
    other[:, 3] = torch.randn(2, 8, 16, generator=gen(9)) * 100  # a rough land-sea mask / orography
    a = selector.score(x, RoutingContext(fields=fields, grid=(4, 8), n_dynamic=3))
    b = selector.score(x, RoutingContext(fields=other, grid=(4, 8), n_dynamic=3))
    assert torch.equal(a, b)
    # the same change does move the score when the constants are (wrongly) counted as dynamic
    c = selector.score(x, RoutingContext(fields=other, grid=(4, 8)))
    assert not torch.allclose(a, c)


def test_laplacian_ranks_a_sharp_localized_feature_first():
    fields = smooth_fields(B=2, n_dyn=3)
    # a narrow bump in one field, at pixel (5, 9) of sample 0 and (0, 15) of sample 1 (edge row, wrap column)
    fields[0, 1, 5, 9] += 30.0
    fields[1, 2, 0, 15] -= 30.0
    ctx = RoutingContext(fields=fields, grid=(4, 8), n_dynamic=3)
    idx = LaplacianSelector().select(torch.zeros(2, 32, 8), 1, context=ctx)
    assert idx.tolist() == [[2 * 8 + 4], [0 * 8 + 7]]  # token = (row // 2) * 8 + col // 2


def test_laplacian_is_not_periodic_in_latitude_and_ignores_linear_trends():
    # f linear in latitude: zero Laplacian everywhere, edge rows included. Wrapping the rows would put the
    # jump between the last and first row into the score; replicate padding would favour the edge rows.
    h, w = 8, 16
    ramp = torch.arange(h, dtype=torch.float32)[:, None].expand(h, w)
    fields = torch.stack([ramp, 5 - 3 * ramp]).unsqueeze(0)
    scores = LaplacianSelector().score(torch.zeros(1, 32, 8), RoutingContext(fields=fields, grid=(4, 8)))
    assert scores.abs().max() < 1e-5
    # a quadratic in latitude has a constant second difference, edges included
    quad = (torch.arange(h, dtype=torch.float32)[:, None] ** 2).expand(h, w)[None, None]
    scores = LaplacianSelector().score(torch.zeros(1, 32, 8), RoutingContext(fields=quad, grid=(4, 8)))
    torch.testing.assert_close(scores, scores.mean().expand_as(scores))


def test_model_tells_the_selector_which_channels_are_constants(tiny_kwargs, tiny_input):
    model = build_model("reslim", **tiny_kwargs, keep_ratio=0.25, selection="laplacian")
    model(tiny_input)
    first = model.router.last_indices
    bumped = tiny_input.clone()
    bumped[:, -1] = torch.randn(2, 16, 32, generator=gen(4)) * 50  # the constant channel
    model(bumped)
    assert torch.equal(model.router.last_indices, first)


# --- learned: difficulty head trained by BCE against error ranks ---------------------------------------


def learned_model(tiny_kwargs, **kw):
    torch.manual_seed(0)
    return build_model("reslim", **{**tiny_kwargs, "keep_ratio": 0.25, "selection": "learned", **kw})


def spearman(a, b):
    ra = a.argsort(dim=1).argsort(dim=1).float()
    rb = b.argsort(dim=1).argsort(dim=1).float()
    ra, rb = ra - ra.mean(dim=1, keepdim=True), rb - rb.mean(dim=1, keepdim=True)
    return ((ra * rb).sum(1) / (ra.norm(dim=1) * rb.norm(dim=1))).mean().item()


def test_per_patch_error_is_the_lat_weighted_patch_mean():
    pred, target = torch.randn(2, 3, 8, 16, generator=gen(0)), torch.randn(2, 3, 8, 16, generator=gen(1))
    lat_w = latitude_weights(torch.linspace(-70, 70, 8))
    err = per_patch_error(pred, target, lat_w, 32)
    assert err.shape == (2, 32)
    manual = ((pred - target)[1, :, 4:6, 10:12].square() * lat_w[4:6, None]).mean()
    torch.testing.assert_close(err[1, 2 * 8 + 5], manual)
    with pytest.raises(ValueError, match="do not tile"):
        per_patch_error(pred, target, lat_w, 30)


def test_selector_loss_is_finite_and_its_gradient_reaches_the_head_only(tiny_kwargs, tiny_input):
    model = learned_model(tiny_kwargs).train()
    pred = model(tiny_input, gen(0))
    target = torch.randn(pred.shape, generator=gen(1))
    aux = selector_loss(model, pred, target, latitude_weights(torch.linspace(-70, 70, 16)))
    assert aux.ndim == 0 and torch.isfinite(aux) and 0 < aux.item() < 5
    aux.backward()
    head = {id(p) for p in model.router.selector.parameters()}
    for name, p in model.named_parameters():
        if id(p) in head:
            assert p.grad is not None and p.grad.abs().sum() > 0, name
        else:
            assert p.grad is None, name


def test_selector_loss_is_none_without_fresh_learned_logits(tiny_kwargs, tiny_input):
    lat_w = latitude_weights(torch.linspace(-70, 70, 16))
    y = torch.zeros(2, 3, 16, 32)
    random = build_model("reslim", **tiny_kwargs, keep_ratio=0.25)
    assert selector_loss(random, random(tiny_input, gen(0)), y, lat_w) is None
    straight = learned_model(tiny_kwargs, selection="learned_st")
    assert isinstance(straight.router.selector, LearnedSelector) and straight.router.selector.straight_through
    assert selector_loss(straight, straight(tiny_input, gen(0)), y, lat_w) is None
    # a dense forward must not leave the previous sparse forward's logits behind
    model = learned_model(tiny_kwargs)
    assert selector_loss(model, model(tiny_input, gen(0)), y, lat_w) is not None
    model.router.keep_ratio = 1.0
    assert selector_loss(model, model(tiny_input, gen(0)), y, lat_w) is None


def test_learned_selection_picks_the_top_logits(tiny_kwargs, tiny_input):
    model = learned_model(tiny_kwargs)
    model(tiny_input, gen(0))
    logits = model.router.selector.last_logits.detach()
    assert torch.equal(model.router.last_indices, logits.topk(32, dim=1).indices.sort(dim=1).values)


def test_a_few_aux_loss_steps_teach_the_head_the_error_ranks(tiny_kwargs, tiny_input):
    model = learned_model(tiny_kwargs).train()
    start = {k: v.clone() for k, v in model.state_dict().items()}
    lat_w = latitude_weights(torch.linspace(-70, 70, 16))
    # a fixed problem: the target differs from the (frozen) forecast by a smooth pattern of local errors
    with torch.no_grad():
        base = model(tiny_input, gen(0))
    yy, xx = torch.meshgrid(torch.arange(16.0), torch.arange(32.0), indexing="ij")
    target = base + 3 * torch.sin(xx / 5) * torch.cos(yy / 4)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)

    def agreement():
        with torch.no_grad():
            pred = model(tiny_input, gen(0))
            return spearman(model.router.selector.last_logits, per_patch_error(pred, target, lat_w, 128))

    before = agreement()
    for _ in range(30):
        pred = model(tiny_input, gen(0))
        opt.zero_grad()
        selector_loss(model, pred, target, lat_w).backward()
        opt.step()
    after = agreement()
    assert after > before + 0.4 and after > 0.5, (before, after)
    moved = {k for k, v in model.state_dict().items() if not torch.equal(v, start[k])}
    assert moved and all(k.startswith("router.selector.head.") for k in moved), moved


@pytest.mark.parametrize("selector", [LaplacianSelector(), GradientSelector()])
def test_regional_grids_join_no_seam_between_their_edges(selector):
    # A regional box: a field that ramps from west to east. Periodic differences would see a cliff between
    # the east and west edges and rank those patches first; the regional score has no such seam.
    h, w = 8, 16
    ramp = torch.linspace(0, 1, w).expand(1, 1, h, w).clone()
    fields = torch.cat([ramp, ramp ** 2], dim=1)
    x = torch.zeros(1, 32, 8)
    regional = selector.score(x, RoutingContext(fields=fields, grid=(4, 8), periodic=False)).view(4, 8)
    periodic = selector.score(x, RoutingContext(fields=fields, grid=(4, 8))).view(4, 8)
    assert periodic[:, -1].min() > 5 * periodic[:, 1:-1].max()  # the seam dominates when wrapped
    assert regional[:, -1].max() <= 2 * regional[:, 1:-1].max() + 1e-6
