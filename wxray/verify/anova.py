"""Nested random-effects ANOVA of a nested ensemble, in 2 and 3 levels, from stored members or streamed.

The stochastic-encoder ensemble nests its draws: `encoder_draw` i < M, within it `dropout_draw`
j < N, and optionally within that `routing_draw` k < R. The ANOVA splits the ensemble variance
pointwise into one share per level; the estimators subtract from each level the noise of the levels
below it, which every level's means still carry.

An ensemble too large to store is split group by group: `group_moments` reduces one encoder draw's
members to five sufficient statistics along a `moment` dim, `merge_moments` combines moment sets in
any order (Chan et al. 1979 parallel update), and `moments_anova` turns the merged moments into the
same split. Invariant: `moments_anova(merge of group_moments of every encoder draw, N, R)` equals
`nested_anova` (R = 1) or `nested_anova3` of the stored members, to float tolerance, while memory
stays at 5 fields whatever M x N x R.

The components are unbiased pointwise, so their means over points, inits or runs are too; a point
estimate can be negative where a true component is small, and that is what every aggregate (domain
means, init means, OSE ratios, rho as a ratio of means, spread-skill) must average. Clipping each point
at zero first biases every aggregate upwards: with a true encoder share of 0.04 in a 7 x 7 design the
domain mean of a clipped U_enc reads 0.062 (+55%). `clip=True` exists for what is only displayed (a
map of one init); nothing in wxray aggregates a clipped component.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import numpy as np
import xarray as xr

from wxray.errors import DataError

ENCODER_DRAW = "encoder_draw"
DROPOUT_DRAW = "dropout_draw"
ROUTING_DRAW = "routing_draw"

MOMENT = "moment"
MOMENTS = ("count", "mean", "ss_between", "ss_mid", "ss_within")
# group_moments records the replicate sizes it saw, so that merging 2- and 3-level moments, or
# giving moments_anova the wrong n or r, is an error rather than a silently wrong split.
N_ATTR, R_ATTR = "anova_n", "anova_r"
SPLIT_COMPONENTS = ("u_enc", "u_drop", "u_route")  # one per level, outermost first

Fields = TypeVar("Fields", xr.DataArray, xr.Dataset)


def _require_nested(forecast: xr.DataArray, dims: Sequence[str], labels: Sequence[str]) -> list[int]:
    name = forecast.name or "forecast"
    if len(set(dims)) != len(dims):
        raise DataError(f"{name}: the ANOVA split needs distinct nested dims, got {tuple(dims)}")
    for dim in dims:
        if dim not in forecast.dims:
            raise DataError(f"{name}: the ANOVA split needs dim '{dim}' (dims: {forecast.dims})")
    sizes = [forecast.sizes[d] for d in dims]
    for dim, label, k in zip(dims, labels, sizes):
        if k < 2:
            raise DataError(f"{name}: the ANOVA split needs at least 2 {label} along '{dim}', got {k}")
    return sizes


def _split2(ms_b, ms_w, n: int, clip: bool) -> dict[str, xr.DataArray]:
    u_enc = (ms_b - ms_w) / n
    if clip:
        u_enc = u_enc.clip(min=0.0)
    u_total = u_enc + ms_w
    with np.errstate(divide="ignore", invalid="ignore"):
        rho_drop = ms_w / u_total
    return {"ms_b": ms_b, "ms_w": ms_w, "u_enc": u_enc, "u_drop": ms_w, "u_total": u_total, "rho_drop": rho_drop}


def _split3(ms_a, ms_b, ms_e, n: int, r: int, clip: bool) -> dict[str, xr.DataArray]:
    u_enc, u_drop = (ms_a - ms_b) / (n * r), (ms_b - ms_e) / r
    if clip:
        u_enc, u_drop = u_enc.clip(min=0.0), u_drop.clip(min=0.0)
    u_total = u_enc + u_drop + ms_e
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = {f"rho_{k}": u / u_total for k, u in (("enc", u_enc), ("drop", u_drop), ("route", ms_e))}
    return {"ms_a": ms_a, "ms_b": ms_b, "ms_e": ms_e, "u_enc": u_enc, "u_drop": u_drop, "u_route": ms_e,
            "u_total": u_total, **rho}


def nested_anova(forecast: xr.DataArray, group_dim: str = ENCODER_DRAW, replicate_dim: str = DROPOUT_DRAW,
                 clip: bool = False) -> xr.Dataset:
    """One-way random-effects ANOVA split of a nested M x N ensemble, pointwise.

    MS_B = N/(M-1) sum_i (ybar_i - ybar)^2, MS_W = sum_ij (y_ij - ybar_i)^2 / (M(N-1)),
    U_drop = MS_W, U_enc = (MS_B - MS_W)/N. The MS_W/N subtraction removes the dropout noise every group
    mean still carries; without it the encoder share is overstated. Both are unbiased; U_enc can be
    negative at a point where the true encoder variance is small (`clip=True` sets it to 0 there, for
    display only: a clipped U_enc is biased upwards and must not be averaged, see the module docstring).
    rho_drop = U_drop / (U_enc + U_drop) pointwise (aggregate it as a ratio of means, not by averaging).
    """
    m, n = _require_nested(forecast, (group_dim, replicate_dim), ("groups", "replicates"))
    group_mean = forecast.mean(replicate_dim)
    grand_mean = group_mean.mean(group_dim)
    ms_b = n / (m - 1) * ((group_mean - grand_mean) ** 2).sum(group_dim)
    ms_w = ((forecast - group_mean) ** 2).sum([group_dim, replicate_dim]) / (m * (n - 1))
    return xr.Dataset(_split2(ms_b, ms_w, n, clip))


def nested_anova3(forecast: xr.DataArray, dims: Sequence[str] = (ENCODER_DRAW, DROPOUT_DRAW, ROUTING_DRAW),
                  clip: bool = False) -> xr.Dataset:
    """Two-stage nested random-effects ANOVA of an M x N x R ensemble, pointwise.

    Model y_ijk = mu + a_i + b_ij + e_ijk, with dims = (i, j, k) outermost first (encoder, dropout,
    routing draws by default) and variances s_a^2, s_b^2, s_e^2:

        MS_A = NR/(M-1) sum_i (ybar_i - ybar)^2            E[MS_A] = s_e^2 + R s_b^2 + NR s_a^2
        MS_B = R/(M(N-1)) sum_ij (ybar_ij - ybar_i)^2      E[MS_B] = s_e^2 + R s_b^2
        MS_E = sum_ijk (y_ijk - ybar_ij)^2 / (MN(R-1))     E[MS_E] = s_e^2

    U_route = MS_E, U_drop = (MS_B - MS_E)/R, U_enc = (MS_A - MS_B)/(NR), each unbiased and possibly
    negative at a point; `clip=True` sets negative U_drop and U_enc to 0, for display only (biased
    upwards: never average a clipped component). U_total = U_enc + U_drop + U_route (never negative:
    MS_A/(NR) + MS_B (1 - 1/N)/R + MS_E (1 - 1/R)) and rho_x = U_x / U_total (NaN where U_total is 0).
    Unlike `nested_anova`, a point with a missing member is NaN (no skipna).
    Returns ms_a, ms_b, ms_e, u_enc, u_drop, u_route, u_total, rho_enc, rho_drop, rho_route.
    """
    dims = tuple(dims)
    if len(dims) != 3:
        raise DataError(f"{forecast.name or 'forecast'}: the 3-level ANOVA split needs 3 dims, got {dims}")
    m, n, r = _require_nested(forecast, dims, ("groups", "replicates", "sub-replicates"))
    cell_mean = forecast.mean(dims[2], skipna=False)
    group_mean = cell_mean.mean(dims[1], skipna=False)
    grand_mean = group_mean.mean(dims[0], skipna=False)
    ms_a = n * r / (m - 1) * ((group_mean - grand_mean) ** 2).sum(dims[0], skipna=False)
    ms_b = r / (m * (n - 1)) * ((cell_mean - group_mean) ** 2).sum(dims[:2], skipna=False)
    ms_e = ((forecast - cell_mean) ** 2).sum(dims, skipna=False) / (m * n * (r - 1))
    return xr.Dataset(_split3(ms_a, ms_b, ms_e, n, r, clip))


def nested_split(forecast: xr.DataArray, clip: bool = False) -> xr.Dataset:
    """The split of a nested ensemble by the member dims it has: `nested_anova3` with a `routing_draw` dim,
    else `nested_anova` (U_enc and U_drop only)."""
    if ROUTING_DRAW in forecast.dims:
        return nested_anova3(forecast, (ENCODER_DRAW, DROPOUT_DRAW, ROUTING_DRAW), clip)
    return nested_anova(forecast, ENCODER_DRAW, DROPOUT_DRAW, clip)


def _stack(parts: Sequence[Fields]) -> Fields:
    out = xr.concat(list(parts), dim=MOMENT, coords="minimal", compat="override", join="exact")
    return out.assign_coords({MOMENT: list(MOMENTS)}).transpose(MOMENT, ...)


def _tag(moments: Fields, n: int | None, r: int | None) -> Fields:
    if n is None:
        return moments
    holders = [moments] + ([moments.variables[v] for v in moments.data_vars] if isinstance(moments, xr.Dataset)
                           else [])
    for h in holders:
        h.attrs.update({N_ATTR: n, R_ATTR: r})
    return moments


def _shape_of(moments: xr.DataArray | xr.Dataset) -> tuple[int | None, int | None]:
    return moments.attrs.get(N_ATTR), moments.attrs.get(R_ATTR)


def group_moments(members: Fields, replicate_dims: Sequence[str] = (DROPOUT_DRAW,), *,
                  group_dim: str = ENCODER_DRAW) -> Fields:
    """Sufficient statistics of ONE top-level group (one encoder draw i), in float64, along `moment`.

    `members` (DataArray or Dataset) holds the draws of group i: no `group_dim`, and the replicate
    dims, outermost first: (dropout_draw,) for 2 levels (j < N) or (dropout_draw, routing_draw) for
    3 levels (j < N, k < R). The replicate dims are reduced and a `moment` dim (first) holds
    MOMENTS = (count, mean, ss_between, ss_mid, ss_within):

        count = 1, mean = ybar_i, ss_between = 0,
        ss_mid = R sum_j (ybar_ij - ybar_i)^2           (0 for 2 levels)
        ss_within = sum_j (y_ij - ybar_i)^2             (2 levels)
                  = sum_jk (y_ijk - ybar_ij)^2          (3 levels)

    A missing member makes that point NaN (no skipna): the nesting must stay balanced. The attrs
    anova_n = N and anova_r = R (1 for 2 levels) let `merge_moments` and `moments_anova` check that
    every group had the same nesting.
    """
    dims = tuple(replicate_dims)
    name = (members.name if isinstance(members, xr.DataArray) else None) or "members"
    if len(dims) not in (1, 2) or len(set(dims)) != len(dims):
        raise DataError(f"{name}: group_moments takes 1 or 2 distinct replicate dims, got {dims}")
    for bad in (group_dim, MOMENT):
        if bad in members.dims:
            raise DataError(f"{name}: group_moments takes one group, without dim '{bad}' "
                            f"(select one draw, e.g. .isel({bad}=i)); dims: {tuple(members.dims)}")
    arrays = members.data_vars.items() if isinstance(members, xr.Dataset) else [(name, members)]
    for var, da in arrays:
        for dim in dims:
            if dim not in da.dims:
                raise DataError(f"{var}: group_moments needs replicate dim '{dim}' (dims: {da.dims})")
            if da.sizes[dim] < 2:
                raise DataError(f"{var}: the ANOVA split needs at least 2 replicates along '{dim}', "
                                f"got {da.sizes[dim]}")
    y = members.astype(np.float64)
    n = members.sizes[dims[0]]
    r = members.sizes[dims[1]] if len(dims) == 2 else 1
    if len(dims) == 1:
        mean = y.mean(dims[0], skipna=False)
        ss_mid = xr.zeros_like(mean)
        ss_within = ((y - mean) ** 2).sum(dims[0], skipna=False)
    else:
        cell = y.mean(dims[1], skipna=False)
        mean = cell.mean(dims[0], skipna=False)
        ss_mid = r * ((cell - mean) ** 2).sum(dims[0], skipna=False)
        ss_within = ((y - cell) ** 2).sum(dims, skipna=False)
    if group_dim in mean.coords:  # the scalar label of the selected draw: not a property of the moments
        mean, ss_mid, ss_within = (x.drop_vars(group_dim) for x in (mean, ss_mid, ss_within))
    out = _stack([xr.ones_like(mean), mean, xr.zeros_like(mean), ss_mid, ss_within])
    return _tag(out, n, r)


def empty_moments(template: Fields, replicate_dims: Sequence[str] = (), *,
                  group_dim: str = ENCODER_DRAW) -> Fields:
    """The identity of `merge_moments`: all moments 0 (count 0), float64, with `moment` first.

    `template` is shaped like one group's members; the `replicate_dims` present in it are dropped
    (leave them out for a template already shaped like the field, e.g. an ensemble-mean field), and
    so is a scalar `group_dim` coord, as in `group_moments`.
    """
    drop = {d: 0 for d in replicate_dims if d in template.dims}
    field = template.isel(drop, drop=True) if drop else template
    if group_dim in field.coords and group_dim not in field.dims:
        field = field.drop_vars(group_dim)
    zero = xr.zeros_like(field, dtype=np.float64)
    return _stack([zero] * len(MOMENTS))


def _moment(m: Fields, key: str) -> Fields:
    return m.sel({MOMENT: key}, drop=True)


def merge_moments(a: Fields, b: Fields) -> Fields:
    """Combine two moment sets (each from any number of groups) by the Chan et al. parallel update.

    count = c_a + c_b, delta = mean_b - mean_a, mean = mean_a + delta c_b / count,
    ss_between = ssb_a + ssb_b + delta^2 c_a c_b / count, ss_mid and ss_within add.
    ss_between is sum_i (ybar_i - ybar)^2 over the groups (not yet times N or NR). A count-0 set
    (`empty_moments`) is an identity on either side, and any merge order gives the same moments to
    float tolerance. Both sets must have the same coords (exact alignment) and nesting (attrs).
    """
    for x in (a, b):
        if MOMENT not in x.dims or list(x[MOMENT].values) != list(MOMENTS):
            raise DataError(f"merge_moments: needs dim '{MOMENT}' labelled {MOMENTS} (dims: {tuple(x.dims)})")
    shape_a, shape_b = _shape_of(a), _shape_of(b)
    if shape_a[0] is not None and shape_b[0] is not None and shape_a != shape_b:
        raise DataError(f"merge_moments: groups with different nesting, (n, r) = {shape_a} and {shape_b}")
    try:
        a, b = xr.align(a, b, join="exact")
    except ValueError as err:
        raise DataError(f"merge_moments: the two moment sets have different coords ({err})") from err
    ca, cb = _moment(a, "count"), _moment(b, "count")
    count = ca + cb
    safe = count.where(count > 0, 1.0)
    delta = _moment(b, "mean") - _moment(a, "mean")
    mean = _moment(a, "mean") + delta * (cb / safe)
    ss_between = _moment(a, "ss_between") + _moment(b, "ss_between") + delta**2 * (ca * cb / safe)
    parts = [count, mean, ss_between] + [_moment(a, k) + _moment(b, k) for k in ("ss_mid", "ss_within")]
    return _tag(_stack(parts), *(shape_a if shape_a[0] is not None else shape_b))


def moments_anova(moments: xr.DataArray, n: int, r: int = 1, clip: bool = False) -> xr.Dataset:
    """The nested ANOVA split from the merged moments of M groups of N (x R) members each.

    M = count (at least 2), n = N >= 2, r = R >= 1 (r = 1: 2 levels). With SSB, SSM, SSW the merged
    ss_between, ss_mid, ss_within:

        r = 1: MS_B = N SSB/(M-1), MS_W = SSW/(M(N-1)), split as `nested_anova`
        r > 1: MS_A = NR SSB/(M-1), MS_B = SSM/(M(N-1)), MS_E = SSW/(MN(R-1)), split as `nested_anova3`

    and `mean`, the ensemble mean. Equals `nested_anova` / `nested_anova3` of the stored members to
    float tolerance. Takes a DataArray only: for a Dataset of moments, call it per data variable
    (`moments_anova(ms[v], n, r)`), since each variable gives a whole Dataset of statistics.
    """
    if not isinstance(moments, xr.DataArray):
        raise TypeError(f"moments_anova takes a DataArray of moments (one variable), got {type(moments).__name__}")
    name = moments.name or "moments"
    if MOMENT not in moments.dims or list(moments[MOMENT].values) != list(MOMENTS):
        raise DataError(f"{name}: moments_anova needs dim '{MOMENT}' labelled {MOMENTS} (dims: {moments.dims})")
    if n < 2 or r < 1 or int(n) != n or int(r) != r:
        raise DataError(f"{name}: the ANOVA split needs n >= 2 replicates and r >= 1 sub-replicates, "
                        f"got n={n}, r={r}")
    n, r = int(n), int(r)
    recorded = _shape_of(moments)
    if recorded[0] is not None and recorded != (n, r):
        raise DataError(f"{name}: moments were gathered with (n, r) = {recorded}, not ({n}, {r})")
    m = _moment(moments, "count")
    if bool((m < 2).any()):
        raise DataError(f"{name}: the ANOVA split needs at least 2 groups, the moments count "
                        f"{float(m.min()):g}")
    ssb, ssm, ssw = (_moment(moments, k) for k in ("ss_between", "ss_mid", "ss_within"))
    if r == 1:
        parts = _split2(n * ssb / (m - 1), ssw / (m * (n - 1)), n, clip)
    else:
        parts = _split3(n * r * ssb / (m - 1), ssm / (m * (n - 1)), ssw / (m * n * (r - 1)), n, r, clip)
    return xr.Dataset({**parts, "mean": _moment(moments, "mean")})
