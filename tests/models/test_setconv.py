"""SetConv: recovery of a smooth field, absent streams, longitude wrap, separable == dense, gradients."""

import math

import pytest
import torch

from wxray.models import SetConv, grid_spacing_deg
from wxray.models.setconv import DEFAULT_LENGTH_SCALE_DEG, EPS

H, W = 32, 64
LAT = torch.linspace(-90.0, 90.0, H)  # the embedded default's grid: 32 x 64, poles included
LON = torch.arange(W) * 360.0 / W


def smooth_field(lat, lon):
    """Real low-wavenumber spherical harmonics Y_1^0 + Y_1^1 + 0.5 Y_2^2 (unnormalised); std ~0.9 on the grid."""
    p, lam = torch.deg2rad(lat), torch.deg2rad(lon)
    return p.sin() + p.cos() * lam.cos() + 0.5 * p.cos() ** 2 * (2 * lam).sin()


def uniform_sphere(n, seed, b=1):
    g = torch.Generator().manual_seed(seed)
    lat = torch.rad2deg(torch.asin(torch.rand(b, n, generator=g) * 2 - 1))
    lon = torch.rand(b, n, generator=g) * 360.0
    return torch.stack([lat, lon], dim=-1)


def dense_points_to_grid(ls, coords, values, mask, lat, lon, periodic=True):
    """Brute force: the full (b, N, h, w) weight tensor from squared distances, then plain sums."""
    dlat = coords[..., 0, None, None] - lat[:, None]
    dlon = coords[..., 1, None, None] - lon[None, :]
    if periodic:
        dlon = (dlon + 180.0) % 360.0 - 180.0
    w = torch.exp(-0.5 * (dlat**2 + dlon**2) / ls**2)  # (b, N, h, w)
    m = mask * torch.isfinite(values)
    v = torch.nan_to_num(values) * m
    density = torch.einsum("bnhw,bnc->bchw", w, m)
    value = torch.einsum("bnhw,bnc->bchw", w, v) / density.clamp_min(EPS)
    return torch.stack([density, value], dim=2).flatten(1, 2)


def test_default_length_scale_is_about_one_grid_step():
    assert DEFAULT_LENGTH_SCALE_DEG == 360 / 64
    assert grid_spacing_deg(LAT, LON) == pytest.approx((180 / 31 + 5.625) / 2)
    sc = SetConv()
    assert isinstance(sc.log_length_scale, torch.nn.Parameter)
    assert "log_length_scale" in sc.state_dict()
    assert sc.length_scale.item() == pytest.approx(5.625)


def test_recovers_smooth_field_from_dense_points():
    """20k noise-free points uniform on the sphere, length scale = grid step (5.7 deg), field std 0.9.

    Bound: RMSE < 0.05 over the grid and max error < 0.25 (reached at the pole rows, where the kernel is
    one-sided; elsewhere the N-W smoothing bias is ~ l^2 f''/2 ~ 1% of the amplitude). grid -> points of the
    exact gridded field back at the points: RMSE < 0.02.
    """
    coords = uniform_sphere(20_000, seed=1)
    values = smooth_field(coords[..., 0], coords[..., 1])[..., None]
    sc = SetConv(grid_spacing_deg(LAT, LON))
    out = sc.points_to_grid(coords, values, torch.ones_like(values), LAT, LON)
    assert out.shape == (1, 2, H, W)
    truth = smooth_field(LAT[:, None], LON[None, :])
    err = out[0, 1] - truth
    assert err.square().mean().sqrt() < 0.05
    assert err.abs().max() < 0.25
    assert out[0, 0].min() > 1.0  # every pixel sees many points

    back = sc.grid_to_points(truth[None, None], LAT, LON, coords)
    assert back.shape == (1, 20_000, 1)
    assert (back[0, :, 0] - values[0, :, 0]).square().mean().sqrt() < 0.02


def test_grid_to_grid_recovers_field_and_skips_nan_gaps():
    """A 2-deg swath-like source grid with 60% of pixels missing (NaN or mask 0) -> 32 x 64 grid."""
    src_lat, src_lon = torch.arange(-89.0, 90.0, 2.0), torch.arange(0.0, 360.0, 2.0)
    field = smooth_field(src_lat[:, None], src_lon[None, :]).expand(1, 1, -1, -1).clone()
    gaps = torch.rand(field.shape, generator=torch.Generator().manual_seed(0)) < 0.6
    mask = torch.ones_like(field)
    mask[gaps & (torch.arange(src_lon.numel()) % 2 == 0)] = 0.0
    field[gaps & (torch.arange(src_lon.numel()) % 2 == 1)] = float("nan")
    field[mask == 0] = 1e6  # masked values must not leak in
    out = SetConv(5.0).grid_to_grid(field, mask, src_lat, src_lon, LAT, LON)
    assert torch.isfinite(out).all()
    err = out[0, 1] - smooth_field(LAT[:, None], LON[None, :])
    assert err.square().mean().sqrt() < 0.05


def test_empty_stream_gives_exact_zero_embedding_and_density():
    coords = uniform_sphere(50, seed=2, b=2)
    values = torch.randn(2, 50, 3)
    mask = torch.ones_like(values)
    mask[1] = 0.0  # sample 1: no observations at all
    mask[0, :, 2] = 0.0  # sample 0: channel 2 absent
    values[1, :10] = float("nan")  # absent values may be NaN
    coords[1, :10] = float("nan")  # and so may padded coordinates
    out = SetConv().points_to_grid(coords, values, mask, LAT, LON)
    assert out.shape == (2, 6, H, W)
    assert torch.equal(out[1], torch.zeros(6, H, W))
    assert torch.equal(out[0, 4:6], torch.zeros(2, H, W))
    assert (out[0, 0] > 0).any() and torch.isfinite(out).all()

    grid_vals = torch.full((1, 2, 8, 16), float("nan"))
    out = SetConv().grid_to_grid(grid_vals, torch.ones_like(grid_vals), LAT[::4], LON[::4], LAT, LON)
    assert torch.equal(out, torch.zeros(1, 4, H, W))


def test_no_observations_at_all_is_zero():
    out = SetConv().points_to_grid(torch.zeros(1, 0, 2), torch.zeros(1, 0, 2), torch.zeros(1, 0, 2), LAT, LON)
    assert torch.equal(out, torch.zeros(1, 4, H, W))


@pytest.mark.parametrize("periodic", [True, False])
def test_observation_at_359_9_reaches_the_0_degree_column_only_when_periodic(periodic):
    row = H // 2
    coords = torch.tensor([[[LAT[row].item(), 359.9]]])  # on a grid row, 0.1 deg west of the 0 deg column
    values, mask = torch.full((1, 1, 1), 2.0), torch.ones(1, 1, 1)
    out = SetConv(2.0, periodic=periodic).points_to_grid(coords, values, mask, LAT, LON)
    if periodic:
        assert out[0, 0, row, 0] > 0.5 and out[0, 1, row, 0].item() == pytest.approx(2.0)
        assert out[0, 0, row, 0] > out[0, 0, row, W // 2]
    else:
        assert out[0, 0, :, 0].max() < 1e-30 and out[0, 1, :, 0].abs().max() < 1e-20
        assert out[0, 0, row, -1] > 0.0  # it still reaches 354.375 deg
    # and the decoder side: a grid value at 0 deg is read at 359.9 deg
    field = torch.zeros(1, 1, H, W)
    field[..., 0] = 1.0
    at = SetConv(2.0, periodic=periodic).grid_to_points(field, LAT, LON, coords)
    assert (at.item() > 0.5) == periodic


@pytest.mark.parametrize("periodic", [True, False])
def test_separable_equals_dense_brute_force(periodic):
    coords = uniform_sphere(300, seed=3, b=2)
    coords[..., 1] -= 180.0  # longitudes in [-180, 180) against a [0, 360) grid: wrap handles both
    values = torch.randn(2, 300, 3, generator=torch.Generator().manual_seed(4))
    mask = (torch.rand(2, 300, 3, generator=torch.Generator().manual_seed(5)) > 0.3).float()
    values[mask == 0] = float("nan")
    sc = SetConv(7.0, periodic=periodic)
    got = sc.points_to_grid(coords, values, mask, LAT, LON)
    want = dense_points_to_grid(7.0, coords, values, mask, LAT, LON, periodic)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)

    # grid -> grid is points -> grid with one point per source pixel
    src_lat, src_lon = LAT[::2], LON[::3]
    g = torch.Generator().manual_seed(6)
    grid_vals = torch.randn(2, 3, src_lat.numel(), src_lon.numel(), generator=g)
    grid_mask = (torch.rand(grid_vals.shape, generator=g) > 0.5).float()
    pts = torch.stack(torch.meshgrid(src_lat, src_lon, indexing="ij"), -1).reshape(1, -1, 2).expand(2, -1, -1)
    flat = lambda t: t.flatten(2).transpose(1, 2)  # noqa: E731
    torch.testing.assert_close(
        sc.grid_to_grid(grid_vals, grid_mask, src_lat, src_lon, LAT, LON),
        dense_points_to_grid(7.0, pts, flat(grid_vals), flat(grid_mask), LAT, LON, periodic),
        rtol=1e-4, atol=1e-5,
    )

    # grid -> points against dense Nadaraya-Watson; weights normalised over all h*w pixels in log space,
    # since (non-periodic) points west of 0 deg are so far from every column that plain exp() underflows;
    # there log-weights reach -300, whose float32 rounding alone moves a weight by ~2e-5 (hence atol 1e-4)
    field = torch.randn(2, 3, H, W, generator=g)
    dlat = coords[..., 0, None, None] - LAT[:, None]
    dlon = coords[..., 1, None, None] - LON[None, :]
    dlon = (dlon + 180.0) % 360.0 - 180.0 if periodic else dlon
    w = (-0.5 * (dlat**2 + dlon**2) / 49.0).flatten(2).softmax(-1).view(2, -1, H, W)
    nw = torch.einsum("bnhw,bchw->bnc", w, field)
    torch.testing.assert_close(sc.grid_to_points(field, LAT, LON, coords), nw, rtol=1e-4, atol=1e-4)


def test_gradients_reach_the_length_scale_in_every_mode():
    coords = uniform_sphere(100, seed=6)
    values = torch.randn(1, 100, 2)
    for name in ("points_to_grid", "grid_to_grid", "grid_to_points"):
        sc = SetConv(4.0)
        if name == "points_to_grid":
            out = sc.points_to_grid(coords, values, torch.ones_like(values), LAT, LON)
        elif name == "grid_to_grid":
            g = torch.randn(1, 2, 16, 32)
            out = sc.grid_to_grid(g, torch.ones_like(g), LAT[::2], LON[::2], LAT, LON)
        else:
            out = sc.grid_to_points(torch.randn(1, 2, H, W), LAT, LON, coords)
        out.square().mean().backward()
        grad = sc.log_length_scale.grad
        assert grad is not None and torch.isfinite(grad) and grad != 0, name


def test_learning_the_length_scale_moves_it():
    """Fitting a grid->points interpolation of a coarse field pulls the length scale towards a useful value."""
    sc = SetConv(0.5)
    opt = torch.optim.Adam(sc.parameters(), lr=0.1)
    coords = uniform_sphere(500, seed=7)
    field = smooth_field(LAT[:, None], LON[None, :])[None, None]
    target = smooth_field(coords[..., 0], coords[..., 1])[..., None]
    for _ in range(20):
        opt.zero_grad()
        loss = (sc.grid_to_points(field, LAT, LON, coords) - target).square().mean()
        loss.backward()
        opt.step()
    assert sc.length_scale.item() > 0.5 * math.e


def test_bad_shapes_and_length_scale_are_rejected():
    with pytest.raises(ValueError, match="length_scale_deg"):
        SetConv(0.0)
    sc = SetConv()
    with pytest.raises(ValueError, match="coords"):
        sc.points_to_grid(torch.zeros(1, 5, 3), torch.zeros(1, 5, 1), torch.zeros(1, 5, 1), LAT, LON)
    with pytest.raises(ValueError, match="values and mask"):
        sc.points_to_grid(torch.zeros(1, 5, 2), torch.zeros(1, 5, 1), torch.zeros(1, 5, 2), LAT, LON)
    with pytest.raises(ValueError, match="source grid"):
        sc.grid_to_grid(torch.zeros(1, 1, 4, 4), torch.zeros(1, 1, 4, 4), LAT[:3], LON[:4], LAT, LON)
    with pytest.raises(ValueError, match="lat/lon"):
        sc.grid_to_points(torch.zeros(1, 1, 4, 4), LAT, LON, torch.zeros(1, 2, 2))
