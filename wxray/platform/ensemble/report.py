"""What a batch ensemble run reports: the variance split (maps, curves; at the stations per variable), scores per
lead, plots, MLflow.

Channels are named as in the rollout reports: `var` for a single-level variable, `var_level` otherwise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from wxray.data.schema import INIT, LEAD, LEVEL
from wxray.io import atomic_path, write_json
from wxray.platform.ensemble.store import STATION, STATION_FORECAST, STATION_VARIABLE, Layout
from wxray.verify.variance import (
    COMPONENT,
    components,
    scores,
    split_members,
    split_moments,
    variance_curves,
    variance_maps,
)


def _hours(leads) -> list[float]:
    return [float(h) for h in np.asarray(leads) / np.timedelta64(1, "h")]


def channels(da: xr.DataArray, var: str) -> list[tuple[str, dict]]:
    """(channel name, selection) of every level of `var`."""
    if LEVEL in da.dims:
        return [(f"{var}_{int(lv)}", {LEVEL: lv}) for lv in da[LEVEL].values]
    return [(var, {})]


def per_channel(ds: xr.Dataset, coord: str, label: str) -> dict[str, list[float]]:
    """{channel: values along lead_time} of entry `label` of dim `coord` of every variable."""
    out = {}
    for var, da in ds.data_vars.items():
        if label not in da[coord].values:
            continue
        for name, sel in channels(da, var):
            out[name] = [float(f"{float(v):.6g}") for v in da.sel({coord: label, **sel}).transpose(LEAD).values]
    return out


def shown_leads(n_leads: int) -> list[int]:
    """Lead 0 and three later leads, evenly spaced to the last."""
    if n_leads <= 4:
        return list(range(n_leads))
    return [0, *sorted({int(round(x)) for x in np.linspace(1, n_leads - 1, 3)})]


def plot_maps(maps: xr.Dataset, folder: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    hours = _hours(maps[LEAD].values)
    leads = shown_leads(len(hours))
    for var, da in maps.data_vars.items():
        for name, sel in channels(da, var):
            field = da.sel(sel)
            comps = list(field[COMPONENT].values)
            fig, axes = plt.subplots(len(comps), len(leads), figsize=(3.2 * len(leads), 1.9 * len(comps)),
                                     squeeze=False, constrained_layout=True)
            for r, comp in enumerate(comps):
                values = field.sel({COMPONENT: comp}).isel({LEAD: leads})
                # the maps hold unbiased init means, slightly negative where a true share is ~0: the colour
                # scale starts at 0 for display (the stored maps and every aggregate stay unclipped)
                vmax = 1.0 if comp == "rho_drop" else float(np.nanmax(values.values)) or 1.0
                for c, k in enumerate(leads):
                    im = axes[r, c].pcolormesh(field.longitude, field.latitude, values.isel({LEAD: c}),
                                               vmin=0.0, vmax=vmax, cmap="viridis", shading="auto")
                    axes[r, c].set_title(f"{comp} +{hours[k]:g} h", fontsize=8)
                    axes[r, c].tick_params(labelsize=6)
                fig.colorbar(im, ax=axes[r, :], shrink=0.8)
            fig.suptitle(f"{name}: variance split (mean over inits)")
            path = folder / f"variance_maps_{name}.png"
            fig.savefig(path, dpi=80)
            plt.close(fig)
            paths.append(path)
    return paths


def plot_curves(curves: xr.Dataset, folder: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [(var, name, sel) for var, da in curves.data_vars.items() for name, sel in channels(da, var)]
    fig, axes = plt.subplots(1, len(names), figsize=(3.6 * len(names), 3.0), squeeze=False, constrained_layout=True)
    hours = _hours(curves[LEAD].values)
    for ax, (var, name, sel) in zip(axes[0], names, strict=True):
        da = curves[var].sel(sel)
        for comp in da[COMPONENT].values:
            if comp != "rho_drop":
                ax.plot(hours, da.sel({COMPONENT: comp}), marker="o", label=str(comp))
        ax.set_xlabel("lead (h)")
        ax.set_title(name, fontsize=9)
        twin = ax.twinx()
        twin.plot(hours, da.sel({COMPONENT: "rho_drop"}), "k--", label="rho_drop")
        twin.set_ylim(0, 1)
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle("domain-mean variance components (left) and rho_drop (dashed, right)")
    path = folder / "variance_curves.png"
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def load_split(layout: Layout, paths: dict[str, Path], store: str = "fields"
               ) -> tuple[xr.Dataset | None, dict[str, xr.Dataset]]:
    """A finished store (members, or None for moments) and its per-variable variance split."""
    p = layout.plan
    ds = xr.open_zarr(paths[store]).load()
    if p.keep_members:
        return ds, split_members(ds)
    return None, split_moments(ds, p.members_n, p.members_r)


def station_split(layout: Layout, paths: dict[str, Path]) -> dict[str, Any]:
    """The decoder's spread at the stations: each U and rho_drop per station variable and lead, as means over
    inits and stations (rho_drop a ratio of means, as on the grid)."""
    _, parts = load_split(layout, paths, "stations")
    part = parts[STATION_FORECAST]
    mean = {c: part[c].mean([INIT, STATION]) for c in (*components(part), "u_total")}
    with np.errstate(divide="ignore", invalid="ignore"):
        mean["rho_drop"] = mean["u_drop"] / mean["u_total"]

    def by_variable(da: xr.DataArray) -> dict[str, list[float]]:
        return {str(v): [float(f"{float(x):.6g}") for x in da.sel({STATION_VARIABLE: v}).transpose(LEAD).values]
                for v in da[STATION_VARIABLE].values}

    return {"rho_drop": by_variable(mean.pop("rho_drop")), "u": {c: by_variable(da) for c, da in mean.items()}}


def analyse(layout: Layout, paths: dict[str, Path], truth_fn, scored_inits: np.ndarray, out_dir: Path, tracker,
            plots: bool) -> dict[str, Any]:
    """Split, maps, curves and scores of the finished stores; files in `out_dir`; metrics to `tracker`."""
    p = layout.plan
    k = p.members_m * p.members_n * p.members_r
    forecast, parts = load_split(layout, paths)
    maps = variance_maps(parts)
    with atomic_path(out_dir / "variance_maps.zarr") as tmp:
        maps.to_zarr(tmp, zarr_format=2, consolidated=True)
    curves = variance_curves(maps)
    report: dict[str, Any] = {"lead_hours": _hours(maps[LEAD].values), "members": k,
                              "rho_drop": per_channel(curves, COMPONENT, "rho_drop"),
                              "u": {c: per_channel(curves, COMPONENT, c) for c in curves[COMPONENT].values
                                    if c != "rho_drop"}}
    if len(scored_inits):
        like = xr.Dataset({v: part["mean"].sel({INIT: scored_inits}) for v, part in parts.items()})
        table = scores(parts, truth_fn(like), (p.members_m, p.members_m * p.members_n, k), forecast)
        report["scored_inits"] = int(len(scored_inits))
        for s in table["score"].values:
            report[str(s)] = per_channel(table, "score", str(s))
    else:
        report["scored_inits"] = 0
    if "stations" in paths:
        report["stations"] = station_split(layout, paths)
    write_json(out_dir / "scores.json", report)
    if tracker is not None:
        logged = {key: report.get(key, {}) for key in ("rho_drop", "ssr_total", "ssr_enc", "ssr_drop", "ssr_route",
                                                        "rmse", "crps")}
        if "stations" in report:
            logged["stations/rho_drop"] = report["stations"]["rho_drop"]
        for key, curves_of in logged.items():
            for ch, values in curves_of.items():
                for step, v in enumerate(values):
                    if np.isfinite(v):
                        tracker.log_metrics({f"ensemble/{key}/{ch}": v}, step=step)
        tracker.log_artifact(out_dir / "scores.json")
    if plots:
        folder = out_dir / "plots"
        folder.mkdir(exist_ok=True)
        files = [*plot_maps(maps, folder), plot_curves(curves, folder)]
        if tracker is not None:
            for f in files:
                tracker.log_artifact(f, "plots")
    return report


def summary_line(report: dict[str, Any]) -> str:
    rho = report["rho_drop"]
    first = next(iter(rho))
    return (f"{first}: rho_drop {' '.join(f'{v:.2f}' for v in rho[first])} by lead"
            + (f"; spread-skill {' '.join(f'{v:.2f}' for v in report['ssr_total'][first])}"
               if "ssr_total" in report else ""))

