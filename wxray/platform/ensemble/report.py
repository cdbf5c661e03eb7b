"""What a batch ensemble run reports: the variance split (maps, curves; at the stations per variable), scores per
lead, plots, MLflow.

Channels are named as in the rollout reports: `var` for a single-level variable, `var_level` otherwise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from wxray.data.schema import INIT, LEAD
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
from wxray.verify.variance_plots import channels, lead_hours, plot_curves, plot_maps


def per_channel(ds: xr.Dataset, coord: str, label: str) -> dict[str, list[float]]:
    """{channel: values along lead_time} of entry `label` of dim `coord` of every variable."""
    out = {}
    for var, da in ds.data_vars.items():
        if label not in da[coord].values:
            continue
        for name, sel in channels(da, var):
            out[name] = [float(f"{float(v):.6g}") for v in da.sel({coord: label, **sel}).transpose(LEAD).values]
    return out


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
    report: dict[str, Any] = {"lead_hours": lead_hours(maps[LEAD].values), "members": k,
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
                for hours, v in zip(report["lead_hours"], values, strict=True):  # step: the lead in hours
                    if np.isfinite(v):
                        tracker.log_metrics({f"ensemble/{key}/{ch}": v}, step=int(round(hours)))
        tracker.log_artifact(out_dir / "scores.json")
    if plots:
        folder = out_dir / "plots"
        folder.mkdir(exist_ok=True)
        source = forecast if forecast is not None else xr.open_zarr(paths["fields"])  # moments: same attrs
        units = {str(v): str(source[v].attrs.get("units", "")) for v in maps.data_vars if v in source}
        inits = next(iter(parts.values())).sizes.get(INIT, 0)
        files = [*plot_maps(maps, folder, units, inits), plot_curves(curves, folder, units)]
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

