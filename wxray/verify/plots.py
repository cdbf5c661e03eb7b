"""Scorecard figures (PNG). Uses matplotlib's object API with the Agg canvas: no pyplot global state,
no display needed, safe in worker processes.

Every plotting function returns a `Figure`; `figures(ds)` yields them by file name and `write_plots` saves
them. Conventions shared by all of them:

* x axis "lead time [h]" with its ticks at the scored leads (at most `MAX_LEAD_TICKS`, every k-th lead);
* y axis and colour bars "<SCORE> [<units>]" from the scorecard's `units` coordinate, written as by hand
  (`verify.units`: m² s⁻²): scores in the variable's units (RMSE, bias, MAE, CRPS, spread), squared units
  for variance parts (U_enc, U_drop), none for dimensionless ones (ACC, SSIM, spread-skill ratio, dropout
  share); maps name the score in the panel title and carry only the units on the colour bar;
* legends name the forecast and the baseline (e.g. "baseline: persistence"); panels follow the scorecard's
  channel order (as configured, else sorted); bias plots carry a zero line;
* the heatmap (WeatherBench 2 scorecard): channels x leads, colour 100 * rel_diff = 100 (forecast /
  baseline - 1) % on a diverging map centred at 0 spanning at least +-1 %, blue where the forecast is better
  (lower RMSE/CRPS, higher ACC/SSIM), the value written in each cell with the digits it needs (-0.05, not
  -0.0) and a dot where the Diebold-Mariano test is significant.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import xarray as xr
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from wxray.data.schema import LAT, LEAD, LON
from wxray.verify import metrics
from wxray.verify.units import units_label

MAX_LEADS_SHOWN = 4  # leads shown in map and rank-histogram grids
MAX_LEAD_TICKS = 12
HEATMAP_MIN_SPAN = 1.0  # percent: the colour scale spans at least +-1 %
DOT = "significant (Diebold-Mariano, p < {:g})"


def figure(nrows: int, ncols: int, w: float = 4.0, h: float = 3.0):
    """A figure of its own with a (nrows, ncols) grid of w x h inch panels (no pyplot state: nothing global
    changes when a job plots)."""
    fig = Figure(figsize=(w * ncols, h * nrows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = np.atleast_2d(fig.subplots(nrows, ncols, squeeze=False))
    return fig, axes


def _hours(ds: xr.Dataset) -> np.ndarray:
    return ds[LEAD].values / np.timedelta64(1, "h")


def _grid(n: int) -> tuple[int, int]:
    ncols = min(n, 3)
    return -(-n // ncols), ncols


def _shown_leads(ds: xr.Dataset) -> list[int]:
    n = ds.sizes[LEAD]
    return sorted(set(np.linspace(0, n - 1, min(n, MAX_LEADS_SHOWN)).round().astype(int).tolist()))


def _hide_unused(axes, used: int) -> None:
    for ax in list(axes.flat)[used:]:
        ax.set_visible(False)


def units_of(ds: xr.Dataset, channel) -> str:
    return str(ds["units"].sel(channel=channel).item()) if "units" in ds.coords else ""


def _with_units(name: str, units: str, power: int) -> str:
    return f"{name} {units_label(units, power)}".strip() if power else name


def score_label(metric: str, units: str = "", one_member: bool = False) -> str:
    """'RMSE [m**2 s**-2]'; no brackets for a dimensionless score or unknown units. A score a one-member forecast
    has as another's ('CRPS (= MAE, one member)') says so there."""
    m = metrics.by_name().get(metric)
    if m is None:
        return metric
    name = metrics.label(metric)
    if one_member and m.one_member_alias:
        name = f"{name} (= {metrics.label(m.one_member_alias)}, one member)"
    return _with_units(name, units, m.unit_power)


def _one_member(ds: xr.Dataset) -> bool:
    return "spread" not in ds["metric"].values


def model_label(ds: xr.Dataset, role: str) -> str:
    """'forecast: exp1/forecast.zarr', 'baseline: persistence' from the scorecard's attrs ('forecast' if unnamed).

    The file's parent folder is kept: every run writes a `forecast.zarr`, its run directory tells them apart.
    """
    name = str(ds.attrs.get(role, "")).removeprefix(f"{role} ").strip()
    p = Path(name)
    short = f"{p.parent.name}/{p.name}" if p.parent.name else p.name
    return f"{role}: {short or name}" if name else role


def _lead_axis(ax, hours: np.ndarray) -> None:
    step = -(-len(hours) // MAX_LEAD_TICKS)
    ticks = hours[::step]
    ax.set_xticks(ticks, [f"{h:g}" for h in ticks])
    ax.set_xlabel("lead time [h]")


def _line(ax, x, sel: xr.Dataset, prefix: str, label: str, color: str, significant=None,
          level: float = 0.05) -> None:
    y = sel[f"{prefix}value"].values
    lower, upper = sel[f"{prefix}ci_lower"].values, sel[f"{prefix}ci_upper"].values
    ax.fill_between(x, lower, upper, color=color, alpha=0.2)
    ax.plot(x, y, "-", color=color, label=label)
    if significant is None:
        ax.plot(x, y, "o", color=color)
        return
    sig = significant == 1
    ax.plot(x[sig], y[sig], "o", color=color, label=DOT.format(level))
    ax.plot(x[~sig], y[~sig], "o", mfc="white", color=color)


def plot_metric(ds: xr.Dataset, metric: str) -> Figure:
    """Score vs lead per channel with its interval band; with a baseline, markers filled where significant."""
    channels = ds["channel"].values
    fig, axes = figure(*_grid(len(channels)))
    x = _hours(ds)
    compared = "baseline_value" in ds
    level = float(ds.attrs.get("significance", 0.05))
    forecast = model_label(ds, "forecast")
    zero = getattr(metrics.by_name().get(metric), "zero_line", None)  # bias plots carry a zero line
    for ax, ch in zip(axes.flat, channels):
        sel = ds.sel(channel=ch, metric=metric)
        if compared and np.isfinite(sel["baseline_value"]).any():
            _line(ax, x, sel, "baseline_", model_label(ds, "baseline"), "tab:gray")
            _line(ax, x, sel, "", forecast, "tab:blue", sel["significant"].values, level)
        else:
            _line(ax, x, sel, "", forecast, "tab:blue")
        if zero is not None:
            ax.axhline(zero, color="k", lw=0.8)
        _lead_axis(ax, x)
        ax.set(title=str(ch), ylabel=score_label(metric, units_of(ds, ch), _one_member(ds)))
        ax.legend(fontsize="small")
    _hide_unused(axes, len(channels))
    return fig


def plot_spread_skill(ds: xr.Dataset) -> Figure:
    channels = ds["channel"].values
    fig, axes = figure(*_grid(len(channels)))
    x = _hours(ds)
    kinds = [("ssr", "total", "tab:blue"), ("ssr_total", "all branches", "tab:purple"),
             ("ssr_enc", "encoder branch", "tab:orange"), ("ssr_drop", "dropout branch", "tab:green"),
             ("ssr_route", "routing branch", "tab:red")]
    for ax, ch in zip(axes.flat, channels):
        for metric, label, color in kinds:
            if metric in ds["metric"].values:
                _line(ax, x, ds.sel(channel=ch, metric=metric), "", label, color)
        ax.axhline(1.0, color="k", lw=0.8, ls="--")
        _lead_axis(ax, x)
        ax.set(title=str(ch), ylabel=score_label("ssr"))
        ax.legend(fontsize="small")
    _hide_unused(axes, len(channels))
    return fig


def plot_rank_histograms(ds: xr.Dataset) -> Figure:
    channels, leads = ds["channel"].values, _shown_leads(ds)
    fig, axes = figure(len(channels), len(leads), 3.0, 2.4)
    ranks = ds["rank"].values
    for r, ch in enumerate(channels):
        for c, j in enumerate(leads):
            ax = axes[r, c]
            ax.bar(ranks, ds["rank_histogram"].sel(channel=ch).isel({LEAD: j}).values, color="tab:blue")
            ax.axhline(1.0 / len(ranks), color="k", lw=0.8, ls="--", label="uniform")
            ax.set(title=f"{ch} +{_hours(ds)[j]:g} h", xlabel="rank of truth among members", ylabel="frequency")
    return fig


MAP_NAMES = {"crps_map": "CRPS", "mae_map": "MAE (CRPS of one member)", "spread_map": "ensemble spread"}


def plot_maps(ds: xr.Dataset, channel: str) -> Figure:
    """Time-mean CRPS (MAE for a one-member forecast) and, for an ensemble, spread maps at up to four leads."""
    kinds = [k for k in MAP_NAMES if k in ds]
    leads = _shown_leads(ds)
    fig, axes = figure(len(leads), len(kinds), 4.5, 2.6)
    lon, lat = ds[LON].values, ds[LAT].values
    units = units_of(ds, channel)
    for r, j in enumerate(leads):
        for c, k in enumerate(kinds):
            ax = axes[r, c]
            field = ds[k].sel(channel=channel).isel({LEAD: j}).values
            mesh = ax.pcolormesh(lon, lat, field, shading="auto", cmap="viridis")
            # the panel's title names the score: the colour bar carries only its units, so nothing is cut off
            fig.colorbar(mesh, ax=ax, shrink=0.8, label=units_label(units))
            ax.set_title(f"{MAP_NAMES[k]} {channel} +{_hours(ds)[j]:g} h", fontsize="medium")
            ax.set(xlabel="longitude [°E]", ylabel="latitude [°N]")
    fig.suptitle(f"time mean over {_inits(ds)}", fontsize="medium")
    return fig


def _inits(ds: xr.Dataset) -> str:
    n = int(ds["n_init"].min()) if "n_init" in ds else 0
    return f"{n} initialisations" if n else "the initialisations"


def plot_heatmap(ds: xr.Dataset, metric: str) -> Figure:
    """WeatherBench 2 style scorecard: 100 * rel_diff of `metric` (channels x leads) against the baseline."""
    rel = 100.0 * ds["rel_diff"].sel(metric=metric).transpose("channel", LEAD).values
    sig = ds["significant"].sel(metric=metric).transpose("channel", LEAD).values == 1
    channels, hours = [str(c) for c in ds["channel"].values], _hours(ds)
    higher = bool(ds["higher_is_better"].sel(metric=metric))
    fig, axes = figure(1, 1, max(6.0, 2.5 + 0.8 * len(hours)), max(3.6, 1.8 + 0.45 * len(channels)))
    ax = axes[0, 0]
    finite = np.abs(rel[np.isfinite(rel)])
    largest = float(finite.max()) if finite.size else 0.0
    # Symmetric about 0 and at least +-HEATMAP_MIN_SPAN %: a -0.05 % difference stays pale, not deep blue.
    lim = max(largest, HEATMAP_MIN_SPAN)
    digits = 1 if largest >= 1 else 2 if largest >= 0.1 else 3
    # Blue is better: a lower score (rel_diff < 0) for RMSE/CRPS, a higher one for ACC/SSIM.
    image = ax.imshow(np.ma.masked_invalid(rel), cmap="RdBu" if higher else "RdBu_r", vmin=-lim, vmax=lim,
                      aspect="auto", interpolation="nearest")
    for (i, j), v in np.ndenumerate(rel):
        if np.isfinite(v):
            ax.text(j, i, f"{v:+.{digits}f}", ha="center", va="center", fontsize="small",
                    color="white" if abs(v) > 0.6 * lim else "black")
    rows, cols = np.nonzero(sig)
    level = float(ds.attrs.get("significance", 0.05))
    ax.scatter(cols + 0.36, rows - 0.3, s=14, c="k", marker="o", label=DOT.format(level))
    ax.set_xticks(np.arange(len(hours)), [f"{h:g}" for h in hours])
    ax.set_yticks(np.arange(len(channels)), channels)
    ax.set_xlabel("lead time [h]")
    name = metrics.label(metric)
    ax.set_title(f"{name}: {model_label(ds, 'forecast')}\nvs {model_label(ds, 'baseline')}", fontsize="medium")
    fig.colorbar(image, ax=ax, label=f"{name} difference [%]\n100 (forecast / baseline - 1)\n"
                                     f"blue: forecast {'higher' if higher else 'lower'} (better)")
    fig.legend(loc="outside lower left", fontsize="small", frameon=False)
    return fig


def heatmap_metrics(ds: xr.Dataset) -> list[str]:
    """The key comparison scores (`Metric.key_comparison`: RMSE, and CRPS for an ensemble: a one-member CRPS is
    the MAE) that have a comparison."""
    if "rel_diff" not in ds:
        return []
    one = _one_member(ds)
    return [m.name for m in metrics.by_name().values() if m.key_comparison and m.name in ds["metric"].values
            and not (one and m.one_member_alias) and np.isfinite(ds["rel_diff"].sel(metric=m.name)).any()]


def no_intervals_note(ds: xr.Dataset) -> str | None:
    """The line a figure carries where the scorecard has no intervals or tests (too few initialisations)."""
    state = str(ds.attrs.get("intervals", "all"))
    if state == "all":
        return None
    where = "" if state == "none" else " at some leads"
    return (f"no intervals or significance{where}: {int(ds['n_init'].min())} initialisation(s) are too few for "
            f"the {ds.attrs.get('significance_method', 'fixed-b')} method")


def _noted(fig: Figure, ds: xr.Dataset) -> Figure:
    note = no_intervals_note(ds)
    if note:
        fig.text(0.5, 0.0, note, ha="center", va="bottom", fontsize="small", color="tab:red")
    return fig


def figures(ds: xr.Dataset) -> Iterator[tuple[str, Figure]]:
    """(file name, figure) for every figure of a scorecard, built one at a time."""
    scored = [str(m) for m in ds["metric"].values if np.isfinite(ds["value"].sel(metric=m)).any()]
    registry = metrics.by_name()
    for m in heatmap_metrics(ds):
        yield f"scorecard_{m}.png", _noted(plot_heatmap(ds, m), ds)
    for m in scored:
        if m in registry and registry[m].plot:
            yield f"score_{m}.png", _noted(plot_metric(ds, m), ds)
    if "ssr" in scored:
        yield "spread_skill.png", _noted(plot_spread_skill(ds), ds)
    if "rank_histogram" in ds:
        yield "rank_histogram.png", plot_rank_histograms(ds)
    for ch in ds["channel"].values:
        yield f"maps_{ch}.png", plot_maps(ds, str(ch))


def write_plots(ds: xr.Dataset, folder: Path) -> list[Path]:
    """Every figure of a scorecard into `folder` as PNG; returns the files written."""
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for name, fig in figures(ds):
        fig.savefig(folder / name, dpi=80)
        files.append(folder / name)
    return files
