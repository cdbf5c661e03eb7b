"""Scorecard figures (PNG). Uses matplotlib's object API with the Agg canvas: no pyplot global state,
no display needed, safe in worker processes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import xarray as xr
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from wxray.data.schema import LAT, LON

LEAD = "lead_time"
MAX_LEADS_SHOWN = 4


def _figure(nrows: int, ncols: int, w: float = 4.0, h: float = 3.0):
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


def _line(ax, x, sel: xr.Dataset, prefix: str, label: str, color: str, significant=None) -> None:
    y = sel[f"{prefix}value"].values
    lower, upper = sel[f"{prefix}ci_lower"].values, sel[f"{prefix}ci_upper"].values
    ax.fill_between(x, lower, upper, color=color, alpha=0.2)
    ax.plot(x, y, "-", color=color, label=label)
    if significant is None:
        ax.plot(x, y, "o", color=color)
        return
    sig = significant == 1
    ax.plot(x[sig], y[sig], "o", color=color, label="significant (DM, 5%)")
    ax.plot(x[~sig], y[~sig], "o", mfc="white", color=color)


def _save(fig, path: Path, axes=None, used: int | None = None) -> Path:
    """Hide the panels a grid did not need, then write the figure."""
    if axes is not None and used is not None:
        for ax in list(axes.flat)[used:]:
            ax.set_visible(False)
    fig.savefig(path, dpi=80)
    return path


def plot_metric(ds: xr.Dataset, metric: str, path: Path) -> Path:
    """Score vs lead per channel with its CI band; with a baseline, markers filled where significant."""
    channels = ds["channel"].values
    fig, axes = _figure(*_grid(len(channels)))
    x = _hours(ds)
    compared = "baseline_value" in ds
    for ax, ch in zip(axes.flat, channels):
        sel = ds.sel(channel=ch, metric=metric)
        if compared and np.isfinite(sel["baseline_value"]).any():
            _line(ax, x, sel, "baseline_", "baseline", "tab:gray")
            _line(ax, x, sel, "", "forecast", "tab:blue", sel["significant"].values)
        else:
            _line(ax, x, sel, "", "forecast", "tab:blue")
        ax.set(title=str(ch), xlabel="lead time (h)", ylabel=metric)
        ax.legend(fontsize="small")
    return _save(fig, path, axes, used=len(channels))


def plot_spread_skill(ds: xr.Dataset, path: Path) -> Path:
    channels = ds["channel"].values
    fig, axes = _figure(*_grid(len(channels)))
    x = _hours(ds)
    kinds = [("ssr", "total", "tab:blue"), ("ssr_total", "U_enc + U_drop", "tab:purple"),
             ("ssr_enc", "encoder branch", "tab:orange"), ("ssr_drop", "dropout branch", "tab:green")]
    for ax, ch in zip(axes.flat, channels):
        for metric, label, color in kinds:
            if metric in ds["metric"].values:
                _line(ax, x, ds.sel(channel=ch, metric=metric), "", label, color)
        ax.axhline(1.0, color="k", lw=0.8, ls="--")
        ax.set(title=str(ch), xlabel="lead time (h)", ylabel="spread-skill ratio")
        ax.legend(fontsize="small")
    return _save(fig, path, axes, used=len(channels))


def plot_rank_histograms(ds: xr.Dataset, path: Path) -> Path:
    channels, leads = ds["channel"].values, _shown_leads(ds)
    fig, axes = _figure(len(channels), len(leads), 3.0, 2.4)
    ranks = ds["rank"].values
    for r, ch in enumerate(channels):
        for c, j in enumerate(leads):
            ax = axes[r, c]
            ax.bar(ranks, ds["rank_histogram"].sel(channel=ch).isel({LEAD: j}).values, color="tab:blue")
            ax.axhline(1.0 / len(ranks), color="k", lw=0.8, ls="--")
            ax.set(title=f"{ch} +{_hours(ds)[j]:g} h", xlabel="rank of truth")
    return _save(fig, path)


def plot_maps(ds: xr.Dataset, channel: str, path: Path) -> Path:
    """Time-mean CRPS (and spread, for an ensemble) maps at up to four leads."""
    kinds = [k for k in ("crps_map", "spread_map") if k in ds]
    leads = _shown_leads(ds)
    fig, axes = _figure(len(leads), len(kinds), 4.5, 2.6)
    lon, lat = ds[LON].values, ds[LAT].values
    for r, j in enumerate(leads):
        for c, k in enumerate(kinds):
            ax = axes[r, c]
            field = ds[k].sel(channel=channel).isel({LEAD: j}).values
            mesh = ax.pcolormesh(lon, lat, field, shading="auto", cmap="viridis")
            fig.colorbar(mesh, ax=ax, shrink=0.8)
            ax.set(title=f"{k.removesuffix('_map')} {channel} +{_hours(ds)[j]:g} h")
    return _save(fig, path)


def write_plots(ds: xr.Dataset, folder: Path) -> list[Path]:
    """Every figure of a scorecard into `folder`; returns the files written."""
    folder.mkdir(parents=True, exist_ok=True)
    metrics = [m for m in ds["metric"].values if np.isfinite(ds["value"].sel(metric=m)).any()]
    files = [plot_metric(ds, m, folder / f"score_{m}.png") for m in metrics
             if m in ("rmse", "bias", "mae", "acc", "ssim", "crps", "spread", "rho_drop")]
    if "ssr" in metrics:
        files.append(plot_spread_skill(ds, folder / "spread_skill.png"))
    if "rank_histogram" in ds:
        files.append(plot_rank_histograms(ds, folder / "rank_histogram.png"))
    files += [plot_maps(ds, str(ch), folder / f"maps_{ch}.png") for ch in ds["channel"].values]
    return files
