"""Ensemble scores: CRPS against `scores` (random and real ERA5 members), spread-skill, rank histograms,
and the nested random-effects ANOVA split."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import scores
import xarray as xr

from wxray.errors import DataError
from wxray.verify.ensemble import (
    branch_spread_skill,
    crps,
    crps_ecdf,
    crps_fair,
    crps_field,
    crps_field_nested,
    ensemble_mean_rmse,
    flatten_members,
    nested_anova,
    nested_spread_skill,
    rank_histogram,
    spread,
    spread_skill_ratio,
)
from wxray.verify.spatial import latitude_weights

LAT = np.linspace(-84.375, 84.375, 16)
LON = np.arange(32) * 11.25


def _ensemble(rng, member_sizes: dict[str, int], n_init=4, centre=None, sigma=1.0):
    coords = {"init_time": pd.date_range("2020-01-01", periods=n_init, freq="6h"), "latitude": LAT,
              "longitude": LON}
    shape = (n_init, 16, 32)
    mu = centre if centre is not None else xr.DataArray(rng.standard_normal(shape), dims=tuple(coords),
                                                        coords=coords)
    noise = xr.DataArray(sigma * rng.standard_normal((*member_sizes.values(), *shape)),
                         dims=(*member_sizes, *coords), coords=coords)
    return mu + noise, mu


@pytest.mark.parametrize("fair", [True, False])
def test_crps_matches_scores_on_random_members(fair):
    rng = np.random.default_rng(0)
    fc, mu = _ensemble(rng, {"member": 7})
    truth = mu + rng.standard_normal(mu.shape)
    method = "fair" if fair else "ecdf"
    ref = scores.probability.crps_for_ensemble(fc, truth, "member", method=method, preserve_dims="all")
    ours = crps_field(fc, truth, "member", fair=fair)
    np.testing.assert_allclose(ours.transpose(*ref.dims).values, ref.values, rtol=1e-10)
    # Spatial means use the same latitude weights as every other score.
    mean_ref = scores.probability.crps_for_ensemble(fc, truth, "member", method=method, preserve_dims=["init_time"],
                                                    weights=latitude_weights(fc.latitude))
    mean_ours = (crps_fair if fair else crps_ecdf)(fc, truth, "member")
    np.testing.assert_allclose(mean_ours.values, mean_ref.values, rtol=1e-10)


def test_nested_dims_are_flattened_only_when_asked():
    rng = np.random.default_rng(1)
    fc, mu = _ensemble(rng, {"encoder_draw": 3, "dropout_draw": 4})
    truth = mu + rng.standard_normal(mu.shape)
    per_draw = crps_field(fc, truth, "dropout_draw")
    assert "encoder_draw" in per_draw.dims  # one CRPS per encoder draw, not silently pooled
    flat = flatten_members(fc)
    assert flat.sizes["member"] == 12 and "encoder_draw" not in flat.dims
    ref = scores.probability.crps_for_ensemble(flat, truth, "member", method="fair", preserve_dims="all")
    pooled = crps_field(fc, truth, ("encoder_draw", "dropout_draw"))
    np.testing.assert_allclose(pooled.transpose(*ref.dims).values, ref.values, rtol=1e-10)


def test_crps_matches_scores_on_real_era5_members(era5_members):
    ds = era5_members.rename(number="member").astype(np.float64)
    for name in ("z", "t"):
        held_out = ds[name].isel(member=0)
        fc = ds[name].isel(member=slice(1, None))
        for truth in (held_out, ds[name].mean("member")):
            for fair, method in ((True, "fair"), (False, "ecdf")):
                ref = scores.probability.crps_for_ensemble(fc, truth, "member", method=method, preserve_dims="all")
                ours = crps_field(fc, truth, "member", fair=fair).transpose(*ref.dims)
                np.testing.assert_allclose(ours.values, ref.values, rtol=1e-10, atol=0)
                assert float(ours.mean()) > 0


def test_deterministic_forecast_is_a_one_member_ensemble():
    rng = np.random.default_rng(2)
    fc, mu = _ensemble(rng, {"member": 1})
    truth = mu + rng.standard_normal(mu.shape)
    expected = (abs(fc.squeeze("member") - truth) * latitude_weights(fc.latitude)).mean(["latitude", "longitude"])
    np.testing.assert_allclose(crps(fc.squeeze("member"), truth).values, expected.values, rtol=1e-12)
    np.testing.assert_allclose(crps(fc, truth, "member").values, expected.values, rtol=1e-12)
    np.testing.assert_allclose(crps_ecdf(fc, truth, "member").values, expected.values, rtol=1e-12)
    with pytest.raises(DataError, match="at least 2 members"):
        crps_fair(fc, truth, "member")
    with pytest.raises(DataError, match="at least 2 members"):
        spread(fc, "member")


def _ssr(sigma_members: float, k: int = 5, seed: int = 3):
    rng = np.random.default_rng(seed)
    centre = xr.DataArray(3.0 * rng.standard_normal((100, 16, 32)), dims=("init_time", "latitude", "longitude"),
                          coords={"latitude": LAT, "longitude": LON})
    fc, _ = _ensemble(rng, {"member": k}, n_init=100, centre=centre, sigma=sigma_members)
    truth = centre + rng.standard_normal(centre.shape)
    return fc, truth


def test_spread_skill_ratio_calibrated_and_under_dispersed():
    k = 5
    fc, truth = _ssr(1.0, k)
    ssr = float(spread_skill_ratio(fc, truth, "member", time_dims=["init_time"]))
    # ~50k points: the sampling sd of the ratio is ~0.006. Without sqrt((K+1)/K) it would be 0.91.
    assert ssr == pytest.approx(1.0, abs=0.03)
    rmse = float(ensemble_mean_rmse(fc, truth, "member", time_dims=["init_time"]))
    assert rmse == pytest.approx(np.sqrt(1 + 1 / k), rel=0.02)
    fc_narrow, truth = _ssr(0.4, k)
    narrow = float(spread_skill_ratio(fc_narrow, truth, "member", time_dims=["init_time"]))
    expected = 0.4 * np.sqrt((k + 1) / k) / np.sqrt(1 + 0.16 / k)
    assert narrow == pytest.approx(expected, abs=0.03) and narrow < 0.5


def test_rank_histogram_flat_when_calibrated_u_shaped_when_under_dispersed():
    k = 5
    fc, truth = _ssr(1.0, k)
    flat = rank_histogram(fc, truth, "member")
    assert flat.sizes["rank"] == k + 1 and float(flat.sum()) == pytest.approx(1.0)
    np.testing.assert_allclose(flat.values, 1 / (k + 1), atol=0.01)
    u = rank_histogram(*_ssr(0.4, k), "member").values
    assert u[0] > 0.3 and u[-1] > 0.3 and u[1:-1].max() < 1 / (k + 1)


def test_anova_estimators_unbiased_on_random_effects_model():
    rng = np.random.default_rng(4)
    m, n, cases = 4, 5, 20000
    sigma_b2, sigma_w2 = 0.5, 2.0
    b = rng.normal(0, np.sqrt(sigma_b2), (cases, m, 1))
    y = xr.DataArray(b + rng.normal(0, np.sqrt(sigma_w2), (cases, m, n)), dims=("case", "encoder_draw",
                                                                                 "dropout_draw"))
    raw = nested_anova(y)  # unclipped by default
    for name, true in (("u_enc", sigma_b2), ("u_drop", sigma_w2)):
        est = raw[name].values
        se = est.std() / np.sqrt(cases)
        assert abs(est.mean() - true) < 4 * se, (name, est.mean(), true, se)
    # The naive between-draw variance keeps sigma_w^2/N of dropout noise (0.4 here, ~80 standard errors).
    naive = y.mean("dropout_draw").var("encoder_draw", ddof=1).mean()
    assert float(naive) - sigma_b2 > 0.3
    clipped = nested_anova(y, clip=True)
    assert float(clipped["u_enc"].min()) >= 0
    np.testing.assert_allclose(clipped["rho_drop"], clipped["u_drop"] / (clipped["u_enc"] + clipped["u_drop"]))


@pytest.mark.parametrize("sizes, message", [({"encoder_draw": 1, "dropout_draw": 4}, "2 groups"),
                                            ({"encoder_draw": 3, "dropout_draw": 1}, "2 replicates")])
def test_anova_needs_two_groups_and_two_replicates(sizes, message):
    fc, _ = _ensemble(np.random.default_rng(5), sizes)
    with pytest.raises(DataError, match=message):
        nested_anova(fc)


def test_branch_spread_skill_ratios_add_in_quadrature():
    rng = np.random.default_rng(6)
    fc, mu = _ensemble(rng, {"encoder_draw": 3, "dropout_draw": 4}, n_init=8)
    fc = fc + xr.DataArray(0.5 * rng.standard_normal(3), dims="encoder_draw")  # an encoder-branch offset
    truth = mu + rng.standard_normal(mu.shape)
    out = nested_spread_skill(fc, truth, time_dims=["init_time"])
    total = float(out["ssr_total"])
    assert float(out["ssr_enc"]) ** 2 + float(out["ssr_drop"]) ** 2 == pytest.approx(total**2, rel=1e-12)
    ratios = branch_spread_skill((np.array([0.0, 1.0]), np.array([1.0, 3.0])), np.array([2.0, 2.0]), (3, 12))
    np.testing.assert_allclose(ratios["ssr_enc"] ** 2 + ratios["ssr_drop"] ** 2, ratios["ssr_total"] ** 2)
    assert 0 < float(out["rho_drop"]) < 1


def _nested_generator(rng, m, n, n_init=64, s_enc=1.0, s_drop=0.5):
    """x_ij = mu + a_i + e_ij and a truth drawn the same way: a calibrated nested ensemble (U_enc = s_enc^2,
    U_drop = s_drop^2)."""
    coords = {"init_time": pd.date_range("2020-01-01", periods=n_init, freq="6h"), "latitude": LAT,
              "longitude": LON}
    shape = (n_init, 16, 32)
    mu = rng.standard_normal(shape)
    a = s_enc * rng.standard_normal((m, 1, *shape))
    fc = xr.DataArray(mu + a + s_drop * rng.standard_normal((m, n, *shape)),
                      dims=("encoder_draw", "dropout_draw", *coords), coords=coords)
    truth = xr.DataArray(mu + s_enc * rng.standard_normal(shape) + s_drop * rng.standard_normal(shape),
                         dims=tuple(coords), coords=coords)
    return fc, truth


def test_nested_fair_crps_counts_only_independent_pairs():
    rng = np.random.default_rng(11)
    fc, truth = _nested_generator(rng, 3, 4, n_init=2)
    got = crps_field_nested(fc, truth)
    x, y = fc.values, truth.values
    between = sum(np.abs(x[i, j] - x[k, q]) for i in range(3) for k in range(3) if i != k
                  for j in range(4) for q in range(4)) / (3 * 2 * 16)
    np.testing.assert_allclose(got.transpose(*truth.dims).values, np.abs(x - y).mean((0, 1)) - between / 2,
                               rtol=1e-10)
    # one member per encoder draw: the plain fair CRPS
    np.testing.assert_allclose(crps_field_nested(fc.isel(dropout_draw=[0]), truth).values,
                               crps_field(fc.isel(dropout_draw=0), truth, "encoder_draw").values, rtol=1e-12)


def test_nested_scores_are_unbiased_where_pooled_members_are_not():
    """At the analysis each encoder draw's N members coincide (no dropout spread): 2 x 4 members are 2 draws."""
    rng = np.random.default_rng(12)
    fc, truth = _nested_generator(rng, 2, 4, s_drop=0.0)
    big, truth_big = _nested_generator(np.random.default_rng(13), 400, 1, n_init=4, s_drop=0.0)
    reference = float(crps_field(big.isel(dropout_draw=0), truth_big, "encoder_draw").mean())  # ~ the true CRPS
    nested = float(crps_field_nested(fc, truth).mean())
    pooled = float(crps_field(fc, truth, ("encoder_draw", "dropout_draw")).mean())
    assert nested == pytest.approx(reference, rel=0.03) and pooled > 1.1 * reference
    # spread-skill: 1 for a calibrated nested ensemble (pooling the 8 members as exchangeable gives 0.66)
    assert float(nested_spread_skill(fc, truth, time_dims=["init_time"])["ssr_total"]) == pytest.approx(1.0, abs=0.03)
    fc, truth = _nested_generator(rng, 3, 4)
    assert float(nested_spread_skill(fc, truth, time_dims=["init_time"])["ssr_total"]) == pytest.approx(1.0, abs=0.03)
