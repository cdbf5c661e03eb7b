"""The scores of an ensemble, as classes (`metric_base`): CRPS, spread, spread-skill, the nested ANOVA's shares.

    crps        fair CRPS (`ensemble.CRPSTerms`): of exchangeable members, or a nested ensemble's (pairs within
                an encoder group left out); a deterministic forecast's is its absolute error, so it always applies
    crps_ecdf   the CRPS of the members' empirical distribution (the same sort as the fair CRPS)
    spread      sqrt(mean over inits of the spatial-mean member variance); nested: of U_enc + U_drop [+ U_route]
    ssr         spread-skill ratio sqrt((K+1)/K) spread / RMSE; nested: ssr_total (below)
    u_*         a nested ensemble's ANOVA components U_enc, U_drop[, U_route] (`verify.anova`), init means
    rho_*       U_c / sum of the U (ratio of means): the dropout and routing shares of the variance
    ssr_*       per-branch ratios sqrt((1 + 1/D_c) U_c / MSE), D_c the independent draws of level c (M, M N,
                M N R); ssr_total = sqrt(sum_c ssr_c^2) (`ensemble.branch_spread_skill`)

A nested metric is bound to its draws (`Metric.bind`): the registry holds one per level, each applying only
where the design has that level. Shared per lead (`Fields.once`): the CRPS terms (one sort of the members),
the variance field and the ANOVA split; `lead_sums` reads the same for the time-mean maps and the rank
histogram (which counts ranks in the CRPS's sorted members: one sort per block of inits serves all three).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import xarray as xr

from wxray.data.schema import LAT, LON
from wxray.verify import ensemble as ens
from wxray.verify.anova import SPLIT_COMPONENTS, nested_split
from wxray.verify.metric_base import Design, Fields, MeanScore, Metric, mean_squared_error
from wxray.verify.spatial import Band, spatial_weights
from wxray.verify.sums import TimeSum

BRANCHES = {"enc": "encoder", "drop": "dropout", "route": "routing"}  # a component's short name, its level


def _nested(f: Fields) -> bool:
    return set(f.member_dims) >= {ens.ENCODER_DRAW, ens.DROPOUT_DRAW}


def _members(f: Fields) -> tuple[xr.DataArray, str]:
    """The members along one dim (nested dims flattened, for the scores that treat them alike)."""
    if len(f.member_dims) > 1:
        return ens.flatten_members(f.forecast, f.member_dims), ens.MEMBER
    return f.forecast, f.member_dims[0]


def _crps_terms(f: Fields) -> ens.CRPSTerms:
    if _nested(f):
        return ens.nested_crps_terms(f.forecast, f.truth, skipna=f.skipna)
    flat, dim = f.once(_members)
    return ens.crps_terms(flat, f.truth, dim, f.skipna)


def crps_field(f: Fields) -> xr.DataArray:
    """The pointwise CRPS: fair of an ensemble, the absolute error of a deterministic forecast."""
    if not f.member_dims:
        return abs(f.mean - f.truth)
    return f.once(_crps_terms).fair()


def _split(f: Fields) -> xr.Dataset:
    return nested_split(f.forecast)


def components(f: Fields) -> dict[str, xr.DataArray]:
    """Per-init spatial means of the ANOVA components the design has (U_enc, U_drop[, U_route])."""
    parts = f.once(_split)
    return {u: f.spatial(parts[u]) for u in SPLIT_COMPONENTS if u in parts}


def variance_field(f: Fields) -> xr.DataArray:
    """Pointwise variance of a new member: unbiased across exchangeable members; of a nested ensemble the sum
    of its components (not the pooled variance, which understates the encoder's share)."""
    if _nested(f):
        parts = f.once(_split)
        return sum(parts[u] for u in SPLIT_COMPONENTS if u in parts)
    return ens.ensemble_variance(*f.once(_members))


def _variance(f: Fields) -> xr.DataArray:
    return f.spatial(f.once(variance_field))


class CRPS(MeanScore):
    name = "crps"
    label = "CRPS"
    inputs = ("crps",)
    loss = "crps"
    unit_power = 1
    plot = True
    headline = 2
    key_comparison = True
    digest = 2
    sweep = 1
    one_member_alias = "mae"

    def series(self, f: Fields) -> dict[str, xr.DataArray]:
        return {"crps": f.spatial(f.once(crps_field))}


class EnsembleMetric(Metric):
    """A score that needs members (K >= 2)."""

    def applies(self, design: Design) -> bool:
        return design.ensemble


class CRPSEcdf(EnsembleMetric, MeanScore):
    name = "crps_ecdf"
    label = "CRPS (ECDF)"
    inputs = ("crps_ecdf",)
    unit_power = 1

    def series(self, f: Fields) -> dict[str, xr.DataArray]:
        return {"crps_ecdf": f.spatial(f.once(_crps_terms).ecdf())}


@dataclass(frozen=True, kw_only=True)
class ExchangeableMetric(EnsembleMetric):
    """A score of exchangeable members (not a nested design), bound to their number K."""

    members: int = 0

    def applies(self, design: Design) -> bool:
        return design.ensemble and not design.nested

    def bind(self, design: Design) -> ExchangeableMetric:
        return replace(self, members=design.members)


class Spread(ExchangeableMetric):
    name = "spread"
    label = "ensemble spread"
    inputs = ("variance",)
    unit_power = 1
    plot = True

    def series(self, f: Fields) -> dict[str, xr.DataArray]:
        return {"variance": f.once(_variance)}

    def from_means(self, variance: np.ndarray) -> np.ndarray:
        return np.sqrt(variance)


class SpreadSkill(ExchangeableMetric):
    name = "ssr"
    label = "spread-skill ratio"
    inputs = ("variance", "mse")
    headline = 3
    calibration = 1.0

    def series(self, f: Fields) -> dict[str, xr.DataArray]:
        return {"variance": f.once(_variance), "mse": f.once(mean_squared_error)}

    def from_means(self, variance: np.ndarray, mse: np.ndarray) -> np.ndarray:
        return ens.spread_skill_from_means(variance, mse, self.members)


@dataclass(frozen=True, kw_only=True)
class NestedMetric(Metric):
    """A score of a nested M x N (x R) design, bound to its independent draws per level (M, M N[, M N R])."""

    draws: tuple[int, ...] = ()

    def applies(self, design: Design) -> bool:
        return design.nested

    def bind(self, design: Design) -> NestedMetric:
        return replace(self, draws=design.draws)

    @property
    def parts(self) -> tuple[str, ...]:
        return SPLIT_COMPONENTS[: len(self.draws)]

    def series(self, f: Fields) -> dict[str, xr.DataArray]:
        return {k: f.once(mean_squared_error) if k == "mse" else f.once(components)[k] for k in self.inputs}


class NestedSpread(NestedMetric):
    """sqrt(U_enc + U_drop [+ U_route]): the spread of a new member, from the unbiased components."""

    name = "spread"
    label = "ensemble spread"
    unit_power = 1
    plot = True

    @property
    def inputs(self) -> tuple[str, ...]:
        return self.parts

    def from_means(self, *means: np.ndarray) -> np.ndarray:
        return np.sqrt(sum(means))

    def aggregate(self, *inputs: np.ndarray) -> np.ndarray:
        return np.sqrt(sum(inputs).mean(-1))  # the total per init first: the numbers scorecards always had


class TotalSpreadSkill(NestedMetric):
    name = "ssr_total"

    @property
    def inputs(self) -> tuple[str, ...]:
        return (*self.parts, "mse")

    def from_means(self, *means: np.ndarray) -> np.ndarray:
        return ens.branch_spread_skill(means[:-1], means[-1], self.draws)["ssr_total"]


class NestedSpreadSkill(TotalSpreadSkill):
    """A nested ensemble's `ssr`: its ssr_total, so that every ensemble's scorecard has an `ssr`."""

    name = "ssr"
    label = "spread-skill ratio"
    headline = 3
    calibration = 1.0


@dataclass(frozen=True, kw_only=True)
class LevelMetric(NestedMetric):
    """One level's score (0: encoder, 1: dropout, 2: routing); applies where the design has that level."""

    level: int = 0

    def applies(self, design: Design) -> bool:
        return design.nested and self.level < len(design.draws)

    @property
    def part(self) -> str:
        return SPLIT_COMPONENTS[self.level]

    @property
    def branch(self) -> str:
        return self.part.removeprefix("u_")


class Component(LevelMetric, MeanScore):
    unit_power = 2

    @property
    def name(self) -> str:
        return self.part

    @property
    def label(self) -> str:
        return f"U_{self.branch}"

    @property
    def inputs(self) -> tuple[str, ...]:
        return (self.part,)


class Share(LevelMetric):
    """rho_c = mean U_c / mean (U_enc + U_drop [+ U_route]): a ratio of means."""

    plot = True

    @property
    def name(self) -> str:
        return f"rho_{self.branch}"

    @property
    def label(self) -> str:
        return f"{BRANCHES[self.branch]} share of variance"

    @property
    def inputs(self) -> tuple[str, ...]:
        return self.parts

    def from_means(self, *means: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return means[self.level] / sum(means)


class BranchSpreadSkill(LevelMetric):
    @property
    def name(self) -> str:
        return f"ssr_{self.branch}"

    @property
    def inputs(self) -> tuple[str, ...]:
        return (*self.parts, "mse")

    def from_means(self, *means: np.ndarray) -> np.ndarray:
        return ens.branch_spread_skill(means[:-1], means[-1], self.draws)[self.name]


def _weights(f: Fields) -> xr.DataArray:
    """The spatial mean's weights of these fields (a band's rows of the whole grid's)."""
    if isinstance(f.region, Band):
        return f.region.weights
    return spatial_weights(f.truth[LAT], f.truth[LON], f.region)


def lead_sums(f: Fields) -> tuple[dict[str, TimeSum], np.ndarray | None]:
    """What the time-mean maps and the rank histogram of these inits add up from: per-point sums over inits of
    an ensemble's CRPS and variance (`spread_map` is the root of the variance's mean) or of a deterministic
    forecast's absolute error (its CRPS: `mae_map`), and the weighted rank counts (`ensemble.rank_counts`,
    from the CRPS's sort of the members; None without members)."""
    if not f.member_dims:
        return {"mae_map": TimeSum.of(f.once(crps_field), f.skipna)}, None
    sums = {"spread_map": TimeSum.of(f.once(variance_field), f.skipna),
            "crps_map": TimeSum.of(f.once(crps_field), f.skipna)}
    return sums, ens.rank_counts(f.once(_crps_terms).sorted, f.truth, _weights(f))


def maps_from_sums(sums: dict[str, TimeSum], latitude: np.ndarray, longitude: np.ndarray) -> dict[str, xr.DataArray]:
    """The time-mean maps from their sums over every init (`lead_sums`, added up)."""
    out = {}
    for k, s in sums.items():
        mean = s.mean()
        out[k] = xr.DataArray(np.sqrt(mean) if k == "spread_map" else mean, dims=(LAT, LON),
                              coords={LAT: latitude, LON: longitude}, name=k)
    return out


def histogram_from_counts(counts: np.ndarray) -> xr.DataArray:
    """The rank histogram (relative frequencies of ranks 1..K+1) from weighted rank counts."""
    with np.errstate(divide="ignore", invalid="ignore"):
        freq = counts / counts.sum()
    ranks = np.arange(1, len(counts) + 1)
    return xr.DataArray(freq, dims=["rank"], coords={"rank": ranks}, name="rank_histogram")


def lead_maps(f: Fields) -> tuple[dict[str, xr.DataArray], xr.DataArray | None]:
    """Time-mean maps of one lead: an ensemble's spread and CRPS and its rank histogram, a deterministic
    forecast's absolute error (its CRPS: `mae_map`) and no histogram."""
    sums, counts = lead_sums(f)
    maps = maps_from_sums(sums, f.truth[LAT].values, f.truth[LON].values)
    return maps, None if counts is None else histogram_from_counts(counts)
