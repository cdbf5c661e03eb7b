"""The variance split aggregated as the platform aggregates it is unbiased: domain and init means of each
component (stored members and streamed moments), the OSE ratio, and the scorecard's spread-skill of a
calibrated nested ensemble, on synthetic nested ensembles with known components (small designs and a true
U_enc of 0 included). Each test also shows that clipping every point at zero first would fail it."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from wxray.data.schema import Channel
from wxray.verify.anova import DROPOUT_DRAW, ENCODER_DRAW, ROUTING_DRAW, group_moments, merge_moments
from wxray.verify.denial import relative_change
from wxray.verify.scorecard import Model, build_scorecard
from wxray.verify.spatial import spatial_mean
from wxray.verify.variance import split_members, split_moments, variance_curves, variance_maps

INIT, LEAD = "init_time", "lead_time"
GRID = {"latitude": np.linspace(-84, 84, 16), "longitude": np.arange(32) * 11.25}


def nested_members(rng, design: tuple[int, ...], shares: tuple[float, ...], inits: int, truth: bool = False):
    """Members y = a_i + b_ij (+ e_ijk) with var(a, b, e) = shares, on (init, lead 1, lat, lon), as a dataset in
    the forecast convention; with `truth`, also one more independent draw of every level (a calibrated truth)."""
    levels = (ENCODER_DRAW, DROPOUT_DRAW, ROUTING_DRAW)[: len(design)]
    field = (inits, 1, *(len(v) for v in GRID.values()))
    extra = 1 if truth else 0
    y = 0.0
    for k, s2 in enumerate(shares):  # level k varies along the first k + 1 member dims
        size = tuple(d + extra for d in design[: k + 1]) + (1,) * (len(design) - k - 1)
        y = y + np.sqrt(s2) * rng.standard_normal((*size, *field))
    coords = {INIT: pd.date_range("2020-01-01", periods=inits, freq="12h"), LEAD: pd.to_timedelta([6], "h"), **GRID}
    dims = (*levels, INIT, LEAD, *GRID)
    members = xr.DataArray(y[tuple(slice(0, d) for d in design)], dims=dims, coords=coords, name="t")
    out = xr.Dataset({"t": members.transpose(INIT, LEAD, *levels, *GRID)})
    if truth:
        out = (out, xr.DataArray(y[tuple(d for d in design)], dims=dims[len(design):], coords=coords, name="t"))
    return out


def _streamed(members: xr.Dataset, design: tuple[int, ...]) -> dict[str, xr.Dataset]:
    """The split as `jobs/ensemble.py keep_members=false` makes it: moments of each encoder draw, merged."""
    replicate = (DROPOUT_DRAW, ROUTING_DRAW)[: len(design) - 1]
    merged = None
    for i in range(design[0]):
        g = group_moments(members.isel({ENCODER_DRAW: i}), replicate)
        merged = g if merged is None else merge_moments(merged, g)
    return split_moments(merged, design[1], design[2] if len(design) == 3 else 1)


CASES = [((2, 2), (0.3, 1.0)), ((4, 4), (0.04, 0.96)), ((7, 7), (0.04, 0.96)), ((2, 8), (0.0, 1.0)),
         ((2, 4, 2), (0.0, 0.5, 0.5)), ((3, 2, 2), (0.04, 0.3, 0.66))]


@pytest.mark.parametrize("design, shares", CASES, ids=[f"{'x'.join(map(str, d))}-{s[0]}" for d, s in CASES])
def test_domain_and_init_means_of_every_component_are_unbiased(design, shares):
    members = nested_members(np.random.default_rng(sum(design)), design, shares, inits=40)
    names = ("u_enc", "u_drop", "u_route")[: len(design)]
    for how, parts in (("stored", split_members(members)), ("streamed", _streamed(members, design))):
        curves = variance_curves(variance_maps(parts))["t"].isel({LEAD: 0})
        for u, true in zip(names, shares, strict=True):
            per_init = spatial_mean(parts["t"][u]).isel({LEAD: 0}).values  # independent across inits
            se = per_init.std(ddof=1) / np.sqrt(per_init.size)
            assert abs(float(curves.sel(component=u)) - true) < 4 * se, (how, u, float(curves.sel(component=u)), se)
        share = float(curves.sel(component="rho_drop"))
        assert abs(share - shares[1] / sum(shares)) < 0.02, (how, share)
    if design == (7, 7):  # the case: a clipped U_enc averages to ~0.062 for 0.04, far outside the error
        clipped = spatial_mean(parts["t"]["u_enc"].clip(min=0)).mean(INIT).isel({LEAD: 0})
        assert float(clipped) > shares[0] + 10 * se


SSR_DESIGNS = [((4, 4), (0.2, 0.8)), ((2, 8), (0.04, 0.96)), ((7, 7), (0.04, 0.96)), ((2, 4, 2), (0.3, 0.3, 0.4))]


@pytest.mark.parametrize("design, shares", SSR_DESIGNS, ids=["x".join(map(str, d)) for d, _ in SSR_DESIGNS])
def test_scorecard_spread_skill_of_a_calibrated_nested_ensemble_is_one(design, shares):
    forecast, truth = nested_members(np.random.default_rng(7 + sum(design)), design, shares, inits=30, truth=True)
    valid = (truth[INIT] + truth[LEAD]).isel({LEAD: 0}).values
    store = xr.Dataset({"t": xr.DataArray(truth.isel({LEAD: 0}).values, dims=("time", *GRID),
                                          coords={"time": valid, **GRID})})
    card = build_scorecard(Model("nested", forecast), store, [Channel("t", None)])
    value = card["value"].sel(channel="t").isel({LEAD: 0})
    lo, hi = (card[k].sel(channel="t").isel({LEAD: 0}) for k in ("ci_lower", "ci_upper"))
    ssr = float(value.sel(metric="ssr"))
    assert float(lo.sel(metric="ssr")) < 1.0 < float(hi.sel(metric="ssr")), ssr
    assert abs(ssr - 1.0) < 0.03, ssr
    for u, true in zip(("u_enc", "u_drop", "u_route"), shares, strict=False):
        assert float(lo.sel(metric=u)) < true < float(hi.sel(metric=u)), (u, float(value.sel(metric=u)))


def test_a_true_denial_response_is_read_unbiased():
    """U_enc doubles when a stream is withheld (+100%) at the paper's day-10 encoder share of 0.04, 7 x 7: the OSE
    statistic reads it within its interval from the unclipped split; clipped points would read about +54%."""
    rng = np.random.default_rng(3)
    series, clipped = {}, {}
    for run, share in (("baseline", 0.04), ("denied", 0.08)):
        members = nested_members(rng, (7, 7), (share, 1 - 0.04), inits=30)
        u = split_members(members)["t"]["u_enc"].isel({LEAD: 0})
        series[run] = {"t": spatial_mean(u).values[None]}  # (lead, init), as ose.domain_series gives
        clipped[run] = {"t": spatial_mean(u.clip(min=0)).values[None]}
    for method in ("fixed-b", "paper"):
        iv = relative_change(series["baseline"], series["denied"], method=method)
        assert float(iv.lower[0]) < 1.0 < float(iv.upper[0]), (method, iv)
    biased = relative_change(clipped["baseline"], clipped["denied"])
    assert float(biased.upper[0]) < 0.8, biased
