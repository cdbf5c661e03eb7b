"""The statistic of an observing-system experiment and its interval: how much a variance component changes
when one observation stream is withheld (`jobs/ose.py`), its table and its figures.

Per lead, from the per-init domain means U_c(t) of one component (U_enc, U_drop or U_route) in channel c,
for the baseline run b and the denial run d (which share every random draw with b):

    change = mean over channels c of ( mean_t U_c^d(t) / mean_t U_c^b(t) ) - 1

The components are the unclipped ANOVA estimates (`verify.anova`): a ratio of means of clipped ones is biased
(a true +100% response in U_enc at a share of 0.04 reads +54%). The interval (`METHODS`):

* "fixed-b" (default): the scorecard's interval (`inference.hac_interval`). The statistic, a smooth function
  of means, is linearised by the jackknife over inits (both runs leave an init together: paired), its
  variance a prewhitened Bartlett HAC estimate with fixed-b critical values. Measured on AR(1) per-init
  series with the statistic above (`benchmarks/bench_significance.py --ose`, BENCHMARKS.md section 3): its
  95% intervals cover 94.4-95.4% at 24-100 inits for lag-1 autocorrelation up to 0.5 and 91.9-95.5% at 0.8.
  Needs 6 inits.
* "paper": the uncertainty paper's percentile interval of a paired circular block bootstrap (one Wilks
  block length, the longest of the series; blocks cut to n/2 when longer). It under-covers on short or
  autocorrelated series (same simulation: 90-96% without autocorrelation, 79-90% at lag-1 0.5, 62-81% at
  0.8); kept to reproduce the paper. Needs 4 inits.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

from wxray.data.schema import INIT, LEAD
from wxray.errors import DataError
from wxray.verify.anova import SPLIT_COMPONENTS
from wxray.verify.inference import (
    MIN_FIXED_B_LENGTH,
    MIN_SERIES_LENGTH,
    Interval,
    block_bootstrap,
    check_method,
    correlation_length,
    hac_interval,
)
from wxray.verify.plots import figure
from wxray.verify.spatial import spatial_mean
from wxray.verify.variance_plots import channels

METHODS = ("fixed-b", "paper")
MIN_INITS = {"fixed-b": MIN_FIXED_B_LENGTH, "paper": MIN_SERIES_LENGTH}


def change_statistic(base: np.ndarray, denied: np.ndarray) -> np.ndarray:
    """(channel, lead, [resample,] init) series of both runs -> the channel-mean relative change per lead."""
    with np.errstate(divide="ignore", invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a channel without spread (U_drop at lead 0): 0/0
        return np.nanmean(denied.mean(-1) / base.mean(-1), axis=0) - 1.0


def _stack(series: Mapping[str, np.ndarray], names: list[str]) -> np.ndarray:
    return np.stack([np.asarray(series[n], dtype=np.float64) for n in names])


def relative_change(base: Mapping[str, np.ndarray], denied: Mapping[str, np.ndarray], *, method: str = "fixed-b",
                    confidence: float = 0.95, n_resamples: int = 2000, seed: int = 0) -> Interval:
    """The change of the module docstring per lead, with its interval, from {channel: (lead, init)} domain
    means of one component in the baseline and the denial run. NaN at a lead where no channel has spread.
    `n_resamples` and `seed` apply to method "paper" only. `block_length` of the result: the HAC bandwidth
    (fixed-b) or the bootstrap block length (paper)."""
    check_method(method)
    names = sorted(base)
    if sorted(denied) != names:
        raise DataError(f"OSE: the baseline has channels {names}, the denial run {sorted(denied)}")
    b, d = _stack(base, names), _stack(denied, names)  # (channel, lead, init)
    n = b.shape[-1]
    if n < MIN_INITS[method]:
        raise DataError(f"OSE intervals ({method}): {n} init(s); need at least {MIN_INITS[method]}")
    if method == "fixed-b":
        with np.errstate(divide="ignore", invalid="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return hac_interval([b, d], change_statistic, confidence=confidence)
    varying = [s for s in (*b.reshape(-1, n), *d.reshape(-1, n)) if np.ptp(s) > 0]
    length = min(max([int(np.max(correlation_length(s))) for s in varying] or [1]), max(1, n // 2))
    with warnings.catch_warnings():  # U_drop is 0 at the analysis: a 0/0 change there is NaN, not an error
        warnings.simplefilter("ignore", RuntimeWarning)
        return block_bootstrap([b, d], change_statistic, block_length=length, n_resamples=n_resamples,
                               confidence=confidence, seed=seed)


def components(members_r: int) -> tuple[str, ...]:
    """The variance components an OSE compares: U_route only where routing is a level (R > 1)."""
    return SPLIT_COMPONENTS if members_r > 1 else SPLIT_COMPONENTS[:2]


def domain_series(parts: dict[str, xr.Dataset], members_r: int) -> dict[str, dict[str, np.ndarray]]:
    """{component: {channel: (lead, init) domain means}} of one run's split (`verify.variance`, per variable)."""
    out: dict[str, dict[str, np.ndarray]] = {c: {} for c in (*components(members_r), "u_total")}
    for var, part in parts.items():
        for c in out:
            mean = spatial_mean(part[c])
            for name, sel in channels(mean, var):
                out[c][name] = mean.sel(sel).transpose(LEAD, INIT).values.astype(np.float64)
    return out


def change_table(series: dict[str, dict], streams: list[str], hours: list[float], members_r: int, *,
                 method: str = "fixed-b", confidence: float = 0.95, n_resamples: int = 2000,
                 seed: int = 0) -> pd.DataFrame:
    """One row per stream, component and lead: the change when the stream is denied and its interval
    (`relative_change`), from the runs' `domain_series` ({"baseline": ..., stream: ...})."""
    rows = []
    for s in streams:
        for c in components(members_r):
            iv = relative_change(series["baseline"][c], series[s][c], method=method, confidence=confidence,
                                 n_resamples=n_resamples, seed=seed)
            rows += [{"stream": s, "component": c, "lead_hours": h, "change": e, "lower": a, "upper": b}
                     for h, e, a, b in zip(hours, iv.estimate, iv.lower, iv.upper, strict=True)]
    return pd.DataFrame(rows)


def plot_ose(table: pd.DataFrame, ranking: list[str], rank_hours: float, folder: Path) -> list[Path]:
    """plots/ose_ranking.png (streams by their U_enc change at `rank_hours`, every component with its interval)
    and plots/ose_leads.png (each component's change against lead)."""
    comps = [c for c in SPLIT_COMPONENTS if c in set(table.component)]
    folder.mkdir(parents=True, exist_ok=True)
    at = table[table.lead_hours == rank_hours].set_index(["stream", "component"])
    fig, ((ax,),) = figure(1, 1, 1.2 * len(ranking) + 2.5, 3.2)
    x = np.arange(len(ranking))
    width = 0.8 / len(comps)
    for k, (c, color) in enumerate(zip(comps, ("tab:blue", "tab:orange", "tab:green"), strict=False)):
        est = np.array([at.loc[(s, c), "change"] for s in ranking]) * 100
        err = np.array([[at.loc[(s, c), "change"] - at.loc[(s, c), "lower"],
                         at.loc[(s, c), "upper"] - at.loc[(s, c), "change"]] for s in ranking]).T * 100
        ax.bar(x + (k - (len(comps) - 1) / 2) * width, est, width, yerr=err, color=color, capsize=3, label=c)
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xticks(x, ranking, rotation=20)
    ax.set_ylabel("change when denied (%)")
    ax.set_title(f"streams by their U_enc change at +{rank_hours:g} h")
    ax.legend(fontsize=8)
    paths = [folder / "ose_ranking.png"]
    fig.savefig(paths[0], dpi=90)
    fig, (axes,) = figure(1, len(comps), 4.5, 3.2)
    for ax, c in zip(axes, comps, strict=True):
        for s in ranking:
            part = table[(table.stream == s) & (table.component == c)]
            ax.plot(part.lead_hours, part.change * 100, marker="o", label=s)
            ax.fill_between(part.lead_hours, part.lower * 100, part.upper * 100, alpha=0.15)
        ax.axhline(0, color="k", lw=0.8)
        ax.set_xlabel("lead (h)")
        ax.set_title(f"{c} change when denied (%)")
    axes[0].legend(fontsize=7)
    paths.append(folder / "ose_leads.png")
    fig.savefig(paths[1], dpi=90)
    return paths
