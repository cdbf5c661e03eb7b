"""Nested ANOVA in 2 and 3 levels: recovery of known variance components on a random-effects model,
the streaming moments (any merge order, empty sets) against the stored-member split, and the errors."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from wxray.errors import DataError
from wxray.verify import ensemble as ens
from wxray.verify.anova import (
    MOMENT,
    MOMENTS,
    ROUTING_DRAW,
    empty_moments,
    group_moments,
    merge_moments,
    moments_anova,
    nested_anova3,
)
from wxray.verify.ensemble import DROPOUT_DRAW, ENCODER_DRAW, nested_anova

DIMS3 = (ENCODER_DRAW, DROPOUT_DRAW, ROUTING_DRAW)
S_A2, S_B2, S_E2 = 4.0, 1.0, 0.25


def _nested(rng, m, n, r, shape=(3, 4), s2=(S_A2, S_B2, S_E2), mu=10.0) -> xr.DataArray:
    """y_ijk = mu + a_i + b_ij + e_ijk over a (latitude, longitude) grid, variances s2."""
    grid = {"latitude": np.linspace(-60, 60, shape[0]), "longitude": np.arange(shape[1]) * 10.0}
    a = rng.normal(0, np.sqrt(s2[0]), (m, 1, 1, *shape))
    b = rng.normal(0, np.sqrt(s2[1]), (m, n, 1, *shape))
    e = rng.normal(0, np.sqrt(s2[2]), (m, n, r, *shape))
    return xr.DataArray(mu + a + b + e, dims=(*DIMS3, *grid), coords=grid, name="t")


def _check_mean_and_variance(est: np.ndarray, expected: float, df: int | None, what: str) -> None:
    """Mean within 4 standard errors of `expected`; for a mean square (df given) also its variance,
    2 E^2/df for a scaled chi-square, within 5 standard errors of a sample variance."""
    p = est.size
    se = est.std() / np.sqrt(p)
    assert abs(est.mean() - expected) < 4 * se, (what, est.mean(), expected, se)
    if df is not None:
        rel_se = np.sqrt((2 + 12 / df) / p)  # sd of a sample variance / variance: sqrt((kurtosis - 1)/p)
        assert est.var() == pytest.approx(2 * expected**2 / df, rel=5 * rel_se), what


def test_three_level_split_recovers_known_components():
    m, n, r = 8, 4, 3
    y = _nested(np.random.default_rng(11), m, n, r, shape=(100, 100))
    raw = nested_anova3(y, clip=False)
    ems = {"ms_a": (S_E2 + r * S_B2 + n * r * S_A2, m - 1), "ms_b": (S_E2 + r * S_B2, m * (n - 1)),
           "ms_e": (S_E2, m * n * (r - 1))}
    for name, (expected, df) in ems.items():
        _check_mean_and_variance(raw[name].values.ravel(), expected, df, name)
    for name, true in (("u_enc", S_A2), ("u_drop", S_B2), ("u_route", S_E2)):
        _check_mean_and_variance(raw[name].values.ravel(), true, None, name)
    np.testing.assert_allclose(raw["u_total"], raw["u_enc"] + raw["u_drop"] + raw["u_route"])
    clipped = nested_anova3(y, clip=True)  # the display option
    assert float(clipped[["u_enc", "u_drop"]].to_array().min()) >= 0
    rho = clipped["rho_enc"] + clipped["rho_drop"] + clipped["rho_route"]
    np.testing.assert_allclose(rho, 1.0)
    np.testing.assert_allclose(clipped["rho_route"], clipped["u_route"] / clipped["u_total"])


def test_two_level_split_recovers_known_components():
    # One routing draw of the 3-level model is a 2-level model whose within-group variance is s_b^2 + s_e^2.
    m, n = 8, 4
    y = _nested(np.random.default_rng(12), m, n, 1, shape=(100, 100)).isel({ROUTING_DRAW: 0}, drop=True)
    raw = nested_anova(y, clip=False)
    s_w2 = S_B2 + S_E2
    _check_mean_and_variance(raw["ms_b"].values.ravel(), s_w2 + n * S_A2, m - 1, "ms_b")
    _check_mean_and_variance(raw["ms_w"].values.ravel(), s_w2, m * (n - 1), "ms_w")
    _check_mean_and_variance(raw["u_enc"].values.ravel(), S_A2, None, "u_enc")
    _check_mean_and_variance(raw["u_drop"].values.ravel(), s_w2, None, "u_drop")


def _stream(members: xr.DataArray | xr.Dataset, replicate_dims, rng) -> xr.DataArray | xr.Dataset:
    """Merge per-encoder-draw moments in a shuffled order: two partial merges (each from an empty set,
    on either side), then merged with each other and with one more empty set."""
    order = rng.permutation(members.sizes[ENCODER_DRAW])
    groups = [group_moments(members.isel({ENCODER_DRAW: int(i)}), replicate_dims) for i in order]
    empty = empty_moments(members.isel({ENCODER_DRAW: 0}), replicate_dims)
    half = len(groups) // 2
    left = empty
    for g in groups[:half]:
        left = merge_moments(left, g)
    right = groups[half]
    for g in groups[half + 1:]:
        right = merge_moments(g, right)
    right = merge_moments(right, empty)
    return merge_moments(empty, merge_moments(right, left))


@pytest.mark.parametrize("levels", [2, 3])
def test_streamed_moments_equal_the_stored_split(levels):
    rng = np.random.default_rng(13)
    y = _nested(rng, 5, 3, 4)
    if levels == 2:
        y = y.isel({ROUTING_DRAW: 0}, drop=True)
        dims, n, r, batch = (DROPOUT_DRAW,), 3, 1, nested_anova(y)
    else:
        dims, n, r, batch = (DROPOUT_DRAW, ROUTING_DRAW), 3, 4, nested_anova3(y)
    merged = _stream(y, dims, rng)
    assert merged.dims[0] == MOMENT and list(merged[MOMENT].values) == list(MOMENTS)
    assert merged.dtype == np.float64
    np.testing.assert_array_equal(merged.sel({MOMENT: "count"}), 5.0)
    streamed = moments_anova(merged, n, r)
    assert set(streamed.data_vars) == set(batch.data_vars) | {"mean"}
    for name in batch.data_vars:
        xr.testing.assert_allclose(streamed[name], batch[name], rtol=1e-9, atol=1e-12)
    xr.testing.assert_allclose(streamed["mean"], y.mean(y.dims[:levels]), rtol=1e-12)
    # Another order gives the same moments.
    xr.testing.assert_allclose(_stream(y, dims, np.random.default_rng(99)), merged, rtol=1e-12, atol=1e-12)


def test_streamed_moments_of_a_dataset_of_two_variables():
    rng = np.random.default_rng(14)
    ds = xr.Dataset({"t": _nested(rng, 4, 3, 2), "u": 3.0 * _nested(rng, 4, 3, 2, mu=-1.0)}).astype(np.float32)
    merged = _stream(ds, (DROPOUT_DRAW, ROUTING_DRAW), rng)
    assert isinstance(merged, xr.Dataset) and set(merged.data_vars) == {"t", "u"}
    for var in ("t", "u"):
        assert merged[var].dims[0] == MOMENT and merged[var].dtype == np.float64
        batch = nested_anova3(ds[var].astype(np.float64))
        streamed = moments_anova(merged[var], 3, 2)
        for name in batch.data_vars:
            xr.testing.assert_allclose(streamed[name], batch[name], rtol=1e-9, atol=1e-12)
    with pytest.raises(TypeError, match="DataArray"):
        moments_anova(merged, 3, 2)


def test_merge_with_empty_is_an_identity_on_either_side():
    y = _nested(np.random.default_rng(15), 2, 3, 2)
    g = group_moments(y.isel({ENCODER_DRAW: 1}), (DROPOUT_DRAW, ROUTING_DRAW))
    empty = empty_moments(y.isel({ENCODER_DRAW: 0}), (DROPOUT_DRAW, ROUTING_DRAW))
    assert float(abs(empty).max()) == 0.0 and empty.dims == g.dims
    for merged in (merge_moments(g, empty), merge_moments(empty, g)):
        xr.testing.assert_identical(merged.drop_attrs(), g.drop_attrs())
    both_empty = merge_moments(empty, empty)
    assert not bool(both_empty.isnull().any()) and float(abs(both_empty).max()) == 0.0


def test_zero_variance_levels_clip_to_exactly_zero():
    rng = np.random.default_rng(16)
    m, n, r = 4, 3, 5
    # Every dropout draw of a group shares its routing noise: the dropout cell means are equal.
    a = rng.normal(0, 2, (m, 1, 1, 6))
    e = rng.normal(0, 1, (m, 1, r, 6))
    y = xr.DataArray(np.broadcast_to(a + e, (m, n, r, 6)), dims=(*DIMS3, "point"))
    for split in (nested_anova3(y, clip=True),
                  moments_anova(_stream(y, (DROPOUT_DRAW, ROUTING_DRAW), rng), n, r, clip=True)):
        assert (split["u_drop"].values == 0.0).all() and (split["rho_drop"].values == 0.0).all()
        assert (split["u_route"].values > 0).all()
    raw = nested_anova3(y, clip=False)
    np.testing.assert_allclose(raw["u_drop"], -raw["ms_e"] / r)
    # Two levels: equal group means give a between-group variance clipped to exactly 0.
    y2 = xr.DataArray(np.broadcast_to(rng.normal(0, 1, (1, n, 6)), (m, n, 6)), dims=(ENCODER_DRAW, DROPOUT_DRAW,
                                                                                   "point"))
    for split in (nested_anova(y2, clip=True), moments_anova(_stream(y2, (DROPOUT_DRAW,), rng), n, clip=True)):
        assert (split["u_enc"].values == 0.0).all() and (split["rho_drop"].values == 1.0).all()


@pytest.mark.parametrize("dim", DIMS3)
def test_anova3_needs_two_draws_along_every_dim(dim):
    y = _nested(np.random.default_rng(17), 3, 3, 3).isel({dim: [0]})
    with pytest.raises(DataError, match=f"t: .*at least 2 .*'{dim}', got 1"):
        nested_anova3(y)
    with pytest.raises(DataError, match=f"t: .*needs dim '{dim}'"):
        nested_anova3(y.isel({dim: 0}, drop=True))


def test_moments_errors():
    y = _nested(np.random.default_rng(18), 3, 3, 2)
    dims = (DROPOUT_DRAW, ROUTING_DRAW)
    one = group_moments(y.isel({ENCODER_DRAW: 0}), dims)
    with pytest.raises(DataError, match="at least 2 groups"):
        moments_anova(merge_moments(one, empty_moments(one.isel({MOMENT: 0}, drop=True))), 3, 2)
    two = merge_moments(one, group_moments(y.isel({ENCODER_DRAW: 1}), dims))
    with pytest.raises(DataError, match=r"\(n, r\) = \(3, 2\), not \(3, 1\)"):
        moments_anova(two, 3)
    with pytest.raises(DataError, match="n >= 2"):
        moments_anova(two, 1, 2)
    two_level = group_moments(y.isel({ENCODER_DRAW: 1, ROUTING_DRAW: 0}), (DROPOUT_DRAW,))
    with pytest.raises(DataError, match="different nesting"):
        merge_moments(one, two_level)
    with pytest.raises(DataError, match="different coords"):
        merge_moments(one, one.assign_coords(latitude=one["latitude"] + 1))
    with pytest.raises(DataError, match=f"without dim '{ENCODER_DRAW}'"):
        group_moments(y, dims)
    with pytest.raises(DataError, match=f"t: group_moments needs replicate dim '{ROUTING_DRAW}'"):
        group_moments(y.isel({ENCODER_DRAW: 0, ROUTING_DRAW: 0}, drop=True), dims)
    ds = xr.Dataset({"t": y.isel({ENCODER_DRAW: 0}), "orog": y.isel({ENCODER_DRAW: 0, DROPOUT_DRAW: 0})})
    with pytest.raises(DataError, match=f"orog: group_moments needs replicate dim '{DROPOUT_DRAW}'"):
        group_moments(ds, dims)


def test_nested_anova_still_importable_from_ensemble():
    assert ens.nested_anova is nested_anova
    assert (ens.ENCODER_DRAW, ens.DROPOUT_DRAW) == (ENCODER_DRAW, DROPOUT_DRAW)
