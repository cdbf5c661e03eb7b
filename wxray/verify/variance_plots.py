"""Figures of a nested ensemble's variance split: maps of each component at lead 0 and three later leads,
and the domain-mean curves against lead (`jobs/ensemble.py` writes both to plots/).

The maps hold unbiased init means of the unclipped components (`verify.variance`), slightly negative where a
true share is ~0: their colour scale starts at 0 for display only.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import xarray as xr

from wxray.data.schema import LEAD, LEVEL
from wxray.verify.field_plots import label_panel
from wxray.verify.plots import figure
from wxray.verify.units import units_label
from wxray.verify.variance import COMPONENT


def lead_hours(leads) -> list[float]:
    return [float(h) for h in np.asarray(leads) / np.timedelta64(1, "h")]


def channels(da: xr.DataArray, var: str) -> list[tuple[str, dict]]:
    """(channel name, selection) of every level of `var`."""
    if LEVEL in da.dims:
        return [(f"{var}_{int(lv)}", {LEVEL: lv}) for lv in da[LEVEL].values]
    return [(var, {})]


def shown_leads(n_leads: int) -> list[int]:
    """Lead 0 and three later leads, evenly spaced to the last."""
    if n_leads <= 4:
        return list(range(n_leads))
    return [0, *sorted({int(round(x)) for x in np.linspace(1, n_leads - 1, 3)})]


def plot_maps(maps: xr.Dataset, folder: Path, units: dict[str, str] | None = None, inits: int = 0) -> list[Path]:
    """One figure per channel: a row per component (U_* in the variable's squared units, rho_drop without),
    a column per shown lead; `units` are the variables' CF units, `inits` how many initialisations the
    means are over."""
    paths = []
    hours = lead_hours(maps[LEAD].values)
    leads = shown_leads(len(hours))
    over = f"mean over {inits} initialisations" if inits else "mean over the initialisations"
    for var, da in maps.data_vars.items():
        for name, sel in channels(da, var):
            field = da.sel(sel)
            comps = list(field[COMPONENT].values)
            fig, axes = figure(len(comps), len(leads), 3.2, 1.9)
            for r, comp in enumerate(comps):
                values = field.sel({COMPONENT: comp}).isel({LEAD: leads})
                # the maps hold unbiased init means, slightly negative where a true share is ~0: the colour
                # scale starts at 0 for display (the stored maps and every aggregate stay unclipped)
                vmax = 1.0 if comp == "rho_drop" else float(np.nanmax(values.values)) or 1.0
                for c, k in enumerate(leads):
                    ax = axes[r, c]
                    im = ax.pcolormesh(field.longitude, field.latitude, values.isel({LEAD: c}),
                                       vmin=0.0, vmax=vmax, cmap="viridis", shading="auto")
                    label_panel(ax, f"{comp} +{hours[k]:g} h", left=c == 0, bottom=r == len(comps) - 1)
                label = "share of U_total" if comp == "rho_drop" else units_label((units or {}).get(var, ""), 2)
                fig.colorbar(im, ax=axes[r, :], shrink=0.8, label=label)
            fig.suptitle(f"{name}: variance split ({over}; U in squared units of {name})", fontsize=9)
            path = folder / f"variance_maps_{name}.png"
            fig.savefig(path, dpi=80)
            paths.append(path)
    return paths


def plot_curves(curves: xr.Dataset, folder: Path, units: dict[str, str] | None = None) -> Path:
    names = [(var, name, sel) for var, da in curves.data_vars.items() for name, sel in channels(da, var)]
    fig, axes = figure(1, len(names), 3.6, 3.0)
    hours = lead_hours(curves[LEAD].values)
    for ax, (var, name, sel) in zip(axes[0], names, strict=True):
        da = curves[var].sel(sel)
        for comp in da[COMPONENT].values:
            if comp != "rho_drop":
                ax.plot(hours, da.sel({COMPONENT: comp}), marker="o", label=str(comp))
        ax.set_xlabel("lead time [h]")
        ax.set_ylabel(f"domain mean {units_label((units or {}).get(var, ''), 2)}".strip(), fontsize=8)
        ax.set_title(name, fontsize=9)
        twin = ax.twinx()
        twin.plot(hours, da.sel({COMPONENT: "rho_drop"}), "k--", label="rho_drop")
        twin.set_ylim(0, 1)
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle("domain-mean variance components (left) and rho_drop (dashed, right)")
    path = folder / "variance_curves.png"
    fig.savefig(path, dpi=80)
    return path
