"""Losses against hand-written numpy and the `scores` package."""

import numpy as np
import pytest
import torch
import xarray as xr
from scores.probability import crps_for_ensemble

from wxray.models import fair_crps, lat_weighted_mse, lat_weighted_mse_per_var, latitude_weights


def test_latitude_weights_are_cosine_with_mean_one():
    lat = torch.linspace(-87.5, 87.5, 36, dtype=torch.float64)
    w = latitude_weights(lat)
    torch.testing.assert_close(w.mean(), torch.tensor(1.0, dtype=torch.float64))
    ratio = w / torch.cos(torch.deg2rad(lat))
    torch.testing.assert_close(ratio, ratio[0].expand_as(ratio))
    assert w[18] > w[0]  # equator outweighs the pole


def test_lat_weighted_mse_matches_numpy_eq3():
    rng = np.random.default_rng(0)
    B, V, h, w = 3, 4, 6, 8
    pred, target = rng.normal(size=(2, B, V, h, w))
    lat = np.linspace(-75, 75, h)
    var_w = np.array([1.0, 0.5, 2.0, 0.25])
    cos = np.cos(np.deg2rad(lat))
    # Eq. 3 written out: sum over grid points i (every (lat, lon) pair), per variable and sample
    expected_per_var = np.zeros(V)
    for v in range(V):
        for b in range(B):
            num = sum(
                cos[i] * (pred[b, v, i, j] - target[b, v, i, j]) ** 2 for i in range(h) for j in range(w)
            )
            expected_per_var[v] += num / (cos.sum() * w) / B
    expected = np.mean(var_w * expected_per_var)

    t = lambda a: torch.tensor(a, dtype=torch.float64)  # noqa: E731
    lw = latitude_weights(t(lat))
    per_var = lat_weighted_mse_per_var(t(pred), t(target), lw)
    np.testing.assert_allclose(per_var.numpy(), expected_per_var, rtol=1e-12)
    loss = lat_weighted_mse(t(pred), t(target), lw, t(var_w))
    assert loss.ndim == 0
    np.testing.assert_allclose(loss.item(), expected, rtol=1e-12)
    # without var_weights it is the plain mean over variables
    np.testing.assert_allclose(
        lat_weighted_mse(t(pred), t(target), lw).item(), expected_per_var.mean(), rtol=1e-12
    )


def test_lat_weighted_mse_rejects_bad_shapes():
    x = torch.zeros(1, 2, 4, 8)
    with pytest.raises(ValueError, match="lat_weights"):
        lat_weighted_mse(x, x, torch.ones(8))
    with pytest.raises(ValueError, match="pred and target"):
        lat_weighted_mse(x, x[:, :1], torch.ones(4))
    with pytest.raises(ValueError, match="var_weights"):
        lat_weighted_mse(x, x, torch.ones(4), torch.ones(3))


@pytest.mark.parametrize("member_dim", [0, 1, -1])
def test_fair_crps_matches_scores_package(member_dim):
    rng = np.random.default_rng(1)
    M, shape = 7, (3, 5, 4)
    ens = np.moveaxis(rng.normal(size=(M, *shape)), 0, member_dim)
    obs = rng.normal(size=shape)
    dims = ["a", "b", "c"]
    ens_dims = list(dims)
    ens_dims.insert(member_dim % 4, "member")
    ref = crps_for_ensemble(
        xr.DataArray(ens, dims=ens_dims),
        xr.DataArray(obs, dims=dims),
        "member",
        method="fair",
        preserve_dims="all",
    ).transpose(*dims)
    got = fair_crps(torch.tensor(ens), torch.tensor(obs), member_dim)
    assert got.dtype == torch.float64 and got.shape == shape
    np.testing.assert_allclose(got.numpy(), ref.values, rtol=1e-10)
    ref_mean = crps_for_ensemble(
        xr.DataArray(ens, dims=ens_dims), xr.DataArray(obs, dims=dims), "member", method="fair"
    )
    np.testing.assert_allclose(got.mean().item(), float(ref_mean), rtol=1e-10)


def test_fair_crps_limits_and_pair_formula():
    obs = torch.tensor([0.0, 1.0, -2.0], dtype=torch.float64)
    # identical members: no spread, CRPS is the absolute error
    same = torch.tensor([0.5, 0.5, 0.5], dtype=torch.float64)[None].expand(5, 3)
    torch.testing.assert_close(fair_crps(same, obs, 0), (same[0] - obs).abs())
    # two members: |x1-y|/2 + |x2-y|/2 - |x1-x2|/2
    two = torch.tensor([[1.0, 0.0, 0.0], [3.0, 2.0, -4.0]], dtype=torch.float64)
    manual = (two - obs).abs().mean(0) - (two[0] - two[1]).abs() / 2
    torch.testing.assert_close(fair_crps(two, obs, 0), manual)
    with pytest.raises(ValueError, match="at least 2"):
        fair_crps(two[:1], obs, 0)
    with pytest.raises(ValueError, match="obs must have shape"):
        fair_crps(two, obs[:2], 0)


def test_fair_crps_gradient_matches_pairwise_formula():
    g = torch.Generator().manual_seed(0)
    ens = torch.randn(6, 10, dtype=torch.float64, generator=g).requires_grad_(True)
    obs = torch.randn(10, dtype=torch.float64, generator=g)
    fair_crps(ens, obs, 0).sum().backward()
    ens2 = ens.detach().clone().requires_grad_(True)
    M = 6
    pairwise = (ens2 - obs).abs().mean(0) - (ens2[:, None] - ens2[None]).abs().sum((0, 1)) / (2 * M * (M - 1))
    pairwise.sum().backward()
    torch.testing.assert_close(ens.grad, ens2.grad)
