"""Where a nested ensemble's spread comes from, over many inits: maps per lead, variable-mean curves, scores.

Per init and grid point the nested ANOVA (`anova.py`) splits the ensemble variance into U_enc (encoder
noise: observation uncertainty), U_drop (MC dropout: model uncertainty) and, with a routing level,
U_route (the Sparse-Reslim token selection). Over a set of inits:

    maps      mean over inits of each U, per lead and point; rho_drop = mean U_drop / mean U_total
    curves    latitude-weighted domain means of the maps per lead; rho_drop = mean U_drop / mean U_total
              (a ratio of means: a point with little spread does not weigh as much as one with a lot)
    scores    ensemble-mean RMSE, fair CRPS of the nested design (stored members only), spread-skill in
              total and per branch: ssr_b = sqrt((1 + 1/D_b) mean U_b / MSE) with D_b the independent draws
              of level b (M, M N, M N R), sharing the ensemble-mean MSE, so the squares add up to
              ssr_total^2 (`verify.ensemble.branch_spread_skill`; 1 for a calibrated nested ensemble)

Every U is the unclipped, unbiased ANOVA estimate (`anova.py`): the maps, curves, shares and ratios average
it as it is, negative point values included, so none of them is biased upwards where a true component is
small. Only the plots (`variance_plots.plot_maps`) start their colour scale at 0.

From stored members (`split_members`) or from streamed moments (`split_moments`): the two give the same
numbers to float tolerance.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import xarray as xr

from wxray.data.schema import INIT
from wxray.errors import DataError
from wxray.verify.anova import (
    DROPOUT_DRAW,
    ENCODER_DRAW,
    ROUTING_DRAW,
    SPLIT_COMPONENTS,
    moments_anova,
    nested_split,
)
from wxray.verify.ensemble import crps_field_nested
from wxray.verify.metrics import metrics_for
from wxray.verify.spatial import spatial_mean

COMPONENT = "component"
BRANCHES = {"u_enc": "enc", "u_drop": "drop", "u_route": "route"}


def split_members(forecast: xr.Dataset) -> dict[str, xr.Dataset]:
    """Per variable, the ANOVA split of stored members (2 levels, or 3 with a `routing_draw` dim)."""
    out = {}
    for var, da in forecast.data_vars.items():
        da = da.astype(np.float64)  # the split subtracts mean squares: float32 members lose digits there
        members = [d for d in (ENCODER_DRAW, DROPOUT_DRAW, ROUTING_DRAW) if d in da.dims]
        out[var] = nested_split(da).assign(mean=da.mean(members))
    return out


def split_moments(moments: xr.Dataset, n: int, r: int = 1) -> dict[str, xr.Dataset]:
    """Per variable, the ANOVA split of streamed moments of M groups of N (x R) members."""
    return {var: moments_anova(da, n, r) for var, da in moments.data_vars.items()}


def components(parts: xr.Dataset) -> list[str]:
    return [c for c in SPLIT_COMPONENTS if c in parts]


def variance_maps(parts: dict[str, xr.Dataset]) -> xr.Dataset:
    """Per variable (component, lead_time, [level,] latitude, longitude): init means of each U and rho_drop."""
    out = {}
    for var, p in parts.items():
        names = [*components(p), "u_total"]
        mean = {c: p[c].mean(INIT) for c in names}
        with np.errstate(divide="ignore", invalid="ignore"):
            mean["rho_drop"] = mean["u_drop"] / mean["u_total"]
        out[var] = xr.concat([mean[c] for c in mean], dim=COMPONENT).assign_coords({COMPONENT: list(mean)})
    return xr.Dataset(out)


def variance_curves(maps: xr.Dataset) -> xr.Dataset:
    """Domain means per lead (and level): each U and rho_drop as a ratio of means."""
    out = {}
    for var, da in maps.data_vars.items():
        us = [c for c in da[COMPONENT].values if c != "rho_drop"]
        mean = spatial_mean(da.sel({COMPONENT: us}))
        rho = mean.sel({COMPONENT: "u_drop"}) / mean.sel({COMPONENT: "u_total"})
        out[var] = xr.concat([mean, rho.expand_dims({COMPONENT: ["rho_drop"]})], dim=COMPONENT)
    return xr.Dataset(out)


def scores(parts: dict[str, xr.Dataset], truth: xr.Dataset, draws: Sequence[int],
           forecast: xr.Dataset | None = None) -> xr.Dataset:
    """Per variable and lead (and level), over the inits `truth` covers: ensemble-mean RMSE, spread-skill in
    total and per branch, and the nested fair CRPS when the members (`forecast`) are given. `draws`: the
    independent draws of each level, (M, M N[, M N R]). The scores are the scorecard's own metrics
    (`verify.metrics`: `rmse`, `crps`, `ssr_*`) aggregated from per-init domain means, here of the split's
    components (stored members or streamed moments alike).

    `truth` is on the forecast's (init_time, lead_time) grid (`verify.forecasts.truth_at` per lead)."""
    out = {}
    for var, p in parts.items():
        if var not in truth:
            raise DataError(f"truth has no variable '{var}' to score the ensemble against")
        inits = truth[INIT].values
        p = p.sel({INIT: inits})
        names = components(p)
        series = {"mse": spatial_mean((p["mean"] - truth[var]) ** 2), **{c: spatial_mean(p[c]) for c in names}}
        if forecast is not None:
            series["crps"] = spatial_mean(crps_field_nested(forecast[var].sel({INIT: inits}), truth[var]))
        like = series["mse"].mean(INIT)
        arrays = {k: v.transpose(*like.dims, INIT).values for k, v in series.items()}
        wanted = ("rmse", *(f"ssr_{c[2:]}" for c in names), "ssr_total", "crps")
        stats = {m.name: like.copy(data=m.aggregate(*(arrays[i] for i in m.inputs)))
                 for m in metrics_for(int(draws[-1]), tuple(draws[: len(names)]), False, wanted)
                 if all(i in arrays for i in m.inputs)}
        out[var] = xr.concat(list(stats.values()), dim="score").assign_coords(score=list(stats))
    return xr.Dataset(out)
