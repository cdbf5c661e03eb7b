"""Maps of fields as a meteorologist reads them: units on every colour bar (`verify.units`: CF strings
written as m s⁻¹), latitude and longitude on the axes, the valid time in the title, and a diverging map centred at 0 for
signed quantities (winds, vorticity, differences) but a sequential one for positive ones (geopotential,
temperature, variances).

`map_scale` decides the colour scale of one field; `plot_field_rows` draws rows of fields (truth, analysis,
their difference) side by side per channel, as the encoder stage's `analysis_vs_truth.png`.
"""

from __future__ import annotations

import numpy as np

from wxray.verify.plots import figure
from wxray.verify.units import units_label

LAT_LABEL, LON_LABEL = "latitude [°N]", "longitude [°E]"


def map_scale(field: np.ndarray, signed: bool | None = None) -> dict:
    """imshow/pcolormesh keywords: a diverging map symmetric about 0 when the field takes both signs (or
    `signed`), else a sequential one over its 1st-99th percentiles."""
    values = np.asarray(field, dtype=float)
    values = values[np.isfinite(values)]
    if values.size == 0:
        return {"cmap": "viridis"}
    lo, hi = np.percentile(values, [1, 99])
    if signed if signed is not None else (lo < 0 < hi):
        lim = float(max(abs(lo), abs(hi))) or 1.0
        return {"cmap": "RdBu_r", "vmin": -lim, "vmax": lim}
    return {"cmap": "viridis", "vmin": float(lo), "vmax": float(hi) if hi > lo else float(lo) + 1.0}


def plot_field_rows(rows: list[tuple[str, np.ndarray]], channels: list[str], units: list[str],
                    latitude: np.ndarray, longitude: np.ndarray, title: str, difference_rows: tuple[int, ...] = ()):
    """One column per channel, one row per (label, fields[channel, lat, lon]); rows not in `difference_rows`
    share a colour scale per channel (that of the first row), difference rows a diverging one of their own."""
    fig, axes = figure(len(rows), len(channels), 3.4, 2.2)
    for j, (name, unit) in enumerate(zip(channels, units, strict=True)):
        shared = map_scale(rows[0][1][j])
        for i, (label, fields) in enumerate(rows):
            ax = axes[i, j]
            scale = map_scale(fields[j], signed=True) if i in difference_rows else shared
            mesh = ax.pcolormesh(longitude, latitude, fields[j], shading="auto", **scale)
            fig.colorbar(mesh, ax=ax, shrink=0.85, label=units_label(unit))
            label_panel(ax, f"{name}: {label}", left=j == 0, bottom=i == len(rows) - 1)
    fig.suptitle(title, fontsize=9)
    return fig


def label_panel(ax, title: str, left: bool, bottom: bool) -> None:
    """A map panel of a grid: its title; latitude on the left column, longitude on the bottom row."""
    ax.set_title(title, fontsize=8)
    ax.tick_params(labelsize=6)
    if left:
        ax.set_ylabel(LAT_LABEL, fontsize=7)
    if bottom:
        ax.set_xlabel(LON_LABEL, fontsize=7)
