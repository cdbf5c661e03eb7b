"""Per-lead scores of a rollout against its store, beside persistence: the `rollout` entry of RESULT.

Per target channel and lead, WeatherBench 2 conventions, latitude-weighted over the forecast's (kept)
grid, at the forecast's own inits:

    rmse = sqrt(mean over inits of the spatial MSE)
    acc  = mean over inits of the uncentred anomaly correlation, anomalies against the store's
           `stats/climatology` at the valid time (only when the store has one)

and the same scores of persistence (the state at init, unchanged) at the same inits and leads, so a
forecast that does not beat persistence shows at once. A forecast with a `member` dim is scored by its
ensemble mean (`jobs/evaluate.py` gives CRPS and spread-skill). The scores are the scorecard's own, those the
registry marks for a rollout (`Metric.rollout`: rmse and acc; `verify.scorecard.build_scorecard`, no
intervals). The report:

    {"lead_hours": [6, 12], "inits": 40, "members": 1, "scored": "forecast",
     "units": {"geopotential_500": "m**2 s**-2"},
     "rmse": {"geopotential_500": [r6, r12]}, "persistence_rmse": {...},
     "acc": {...}, "persistence_acc": {...}}          # acc entries only with a climatology
"""

from __future__ import annotations

from typing import Any

import numpy as np
import xarray as xr

from wxray.data.schema import INIT, LEAD, LEVEL, MEMBER, Channel
from wxray.verify import metrics
from wxray.verify.forecasts import crop_to, persistence_forecast, truth_at
from wxray.verify.scorecard import Model, build_scorecard


def rollout_scores() -> list[str]:
    """The scores of a rollout's report (`Metric.rollout`), in the registry's order."""
    return [m.name for m in metrics.by_name().values() if m.rollout]


def on_grid(ds: xr.Dataset, forecast: xr.Dataset, what: str) -> xr.Dataset:
    """`ds` (store grid) at the points of `forecast`, a block of it (the kept rows and columns of a cropped
    grid, for instance), with the forecast's coordinates: `wxray.verify.forecasts.crop_to`."""
    return crop_to(ds, forecast, what)


def at_levels(da: xr.DataArray, like: xr.DataArray) -> xr.DataArray:
    """`da` at the levels of `like` (the forecast's target levels, a subset of the store's)."""
    return da.sel({LEVEL: like[LEVEL].values}) if LEVEL in like.dims and LEVEL in da.dims else da


def _channel_names(da: xr.DataArray, var: str) -> list[str]:
    return [f"{var}_{int(lv)}" for lv in da[LEVEL].values] if LEVEL in da.dims else [var]


def score_per_lead(forecast: xr.Dataset, truth: xr.Dataset,
                   climatology: xr.Dataset | None = None) -> dict[str, dict[str, list[float]]]:
    """{"rmse": {channel: [per lead]}, "acc": {...}} (`rollout_scores`); "acc" only where `climatology` has the
    variable. The scorecard's metrics (`verify.metrics`), without intervals: the same as `jobs/evaluate.py`."""
    truth = on_grid(truth, forecast, "store")
    if climatology is not None:
        climatology = on_grid(climatology, forecast, "store stats/climatology")
    names = rollout_scores()
    out: dict[str, dict[str, list[float]]] = {name: {} for name in names}
    for var in map(str, forecast.data_vars):
        da = forecast[var]
        chans = [Channel(var, int(lv)) for lv in da[LEVEL].values] if LEVEL in da.dims else [Channel(var)]
        clim = climatology if climatology is not None and var in climatology else None
        card = build_scorecard(Model(f"forecast {var}", forecast[[var]]), truth, chans, climatology=clim,
                               skipna=True, metrics=names, intervals=False, maps=False)
        for name in out:
            if name in card["metric"].values:
                out[name].update({ch.name: card["value"].sel(channel=ch.name, metric=name).values.tolist()
                                  for ch in chans})
    return {k: v for k, v in out.items() if v}


def truth_like(ds: xr.Dataset, like: xr.Dataset) -> xr.Dataset:
    """The store's state at the valid times init + lead of `like` (dims init_time, lead_time, ...)."""
    truth = on_grid(ds, like, "store")
    inits = like[INIT].values
    out = {}
    for var in like.data_vars:
        per_lead = [at_levels(truth_at(truth[var], inits, lead, f"truth {var}"), like[var])
                    for lead in like[LEAD].values]
        out[var] = xr.concat(per_lead, dim=LEAD).assign_coords({LEAD: like[LEAD].values})
    return xr.Dataset(out)


def persistence_like(forecast: xr.Dataset, truth: xr.Dataset) -> xr.Dataset:
    """Persistence at the forecast's inits, leads, points and levels."""
    names = list(map(str, forecast.data_vars))
    pers = persistence_forecast(on_grid(truth, forecast, "store"), forecast[INIT].values, forecast[LEAD].values,
                                names)
    return xr.Dataset({v: at_levels(pers[v], forecast[v]) for v in names})


def _hours(leads: np.ndarray) -> list[float | int]:
    hours = [float(h) for h in leads / np.timedelta64(1, "h")]
    return [int(h) if h.is_integer() else h for h in hours]


def rollout_report(forecast: xr.Dataset, truth: xr.Dataset, climatology: xr.Dataset | None = None,
                   mean: xr.Dataset | None = None) -> dict[str, Any]:
    """The self-describing per-lead scores of the module docstring. `mean`: the ensemble mean of `forecast`
    in float64, where the caller has it (e.g. written once, chunk by chunk); else it is taken lazily."""
    # The ensemble mean is all the scores read: memory then does not grow with members.
    if mean is None:
        mean = forecast.astype(np.float64).mean(MEMBER) if MEMBER in forecast.dims else forecast
    scores = score_per_lead(mean, truth, climatology)
    persistence = score_per_lead(persistence_like(forecast, truth), truth, climatology)
    units = {ch: str(truth[var].attrs.get("units", "")) for var in map(str, forecast.data_vars)
             for ch in _channel_names(forecast[var], var)}
    return {"lead_hours": _hours(forecast[LEAD].values), "inits": int(forecast.sizes[INIT]),
            "members": int(forecast.sizes.get(MEMBER, 1)),
            "scored": "ensemble mean" if MEMBER in forecast.dims else "forecast", "units": units,
            **scores, **{f"persistence_{k}": v for k, v in persistence.items()}}


def log_report(report: dict[str, Any], tracker) -> None:
    """One MLflow metric per score and channel, the lead in hours as the step: curves against lead."""
    scores = [prefix + name for prefix in ("", "persistence_") for name in rollout_scores()]
    for j, hours in enumerate(report["lead_hours"]):
        values = {f"rollout/{score}/{ch}": per_lead[j] for score in scores if score in report
                  for ch, per_lead in report[score].items()}
        tracker.log_metrics(values, step=int(round(hours)))
