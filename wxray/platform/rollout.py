"""Autoregressive rollout of a trained forecaster on the test split, written in the forecast convention
(`init_time`, `lead_time`, [`level`,] `latitude`, `longitude`) that `jobs/evaluate.py` scores, and
scored per lead with latitude-weighted RMSE against the store.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
import xarray as xr
from tqdm.auto import tqdm

from wxray.data.schema import LAT, LEVEL, LON, TIME, time_step
from wxray.platform.windows import WindowReader, WindowSpec, per_channel, to_physical, valid_anchors


def rollout_anchors(ds: xr.Dataset, test_anchors: np.ndarray, spec: WindowSpec, steps: int) -> np.ndarray:
    ok = valid_anchors(ds, spec.history, steps * spec.lead_steps)
    return np.intersect1d(test_anchors, ok)


def _normalise_state(spec: WindowSpec, phys: torch.Tensor) -> torch.Tensor:
    base = spec.target_in_input
    return (phys - per_channel(spec.in_mean[base], phys)) / per_channel(spec.in_std[base], phys)


@torch.no_grad()
def rollout(model: torch.nn.Module, spec: WindowSpec, anchors: np.ndarray, steps: int, seed: int = 0,
            batch_size: int = 8) -> np.ndarray:
    """(n_init, steps, V_out, h, w) physical forecasts; step k is valid at anchor + (k+1) * lead."""
    autoregressive = [c.name for c in spec.targets] == [c.name for c in spec.inputs]
    if steps > 1 and not autoregressive:
        raise ValueError("a rollout beyond one step needs the targets to be the input variables")
    if steps > 1 and spec.history > 1 and spec.lead_steps > 1:
        raise ValueError("a rollout beyond one step with history > 1 needs lead_steps = 1 "
                         "(the model was trained on consecutive native steps)")
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    reader = WindowReader(spec)
    v, h = len(spec.inputs), spec.history
    out = []
    for i in tqdm(range(0, len(anchors), batch_size), desc="rollout"):
        x = torch.from_numpy(reader({"anchor": anchors[i: i + batch_size]})["x"])
        preds = []
        for _ in range(steps):
            phys = to_physical(spec, model(x, generator=gen).float(), x)
            preds.append(phys.numpy())
            state = _normalise_state(spec, phys)
            x = torch.cat([x[:, v: h * v], state, x[:, h * v:]], dim=1)
        out.append(np.stack(preds, axis=1))
    return np.concatenate(out) if out else np.zeros((0, steps, len(spec.targets), *spec.grid), np.float32)


def to_forecast_dataset(fc: np.ndarray, spec: WindowSpec, ds: xr.Dataset, anchors: np.ndarray) -> xr.Dataset:
    """Forecast-convention dataset: one variable per target variable, `level` where the store has it."""
    step = time_step(ds) * spec.lead_steps
    leads = pd.to_timedelta([step * (k + 1) for k in range(fc.shape[1])])
    coords = {"init_time": ds[TIME].values[anchors], "lead_time": leads,
              LAT: spec.latitude, LON: spec.longitude}
    data = {}
    for var in dict.fromkeys(c.variable for c in spec.targets):
        idx = [i for i, c in enumerate(spec.targets) if c.variable == var]
        levels = [spec.targets[i].level for i in idx]
        if levels[0] is None:
            data[var] = (("init_time", "lead_time", LAT, LON), fc[:, :, idx[0]])
        else:
            data[var] = xr.DataArray(fc[:, :, idx], dims=("init_time", "lead_time", LEVEL, LAT, LON),
                                     coords={**coords, LEVEL: levels})
    out = xr.Dataset(data, coords=coords)
    out.attrs["source"] = "wxray rollout"
    return out


def score_per_lead(forecast: xr.Dataset, truth: xr.Dataset) -> dict[str, list[float]]:
    """Latitude-weighted RMSE (WeatherBench 2: time mean of the spatial MSE, then the root) per channel and lead."""
    from wxray.verify.deterministic import rmse
    from wxray.verify.forecasts import truth_at

    out: dict[str, list[float]] = {}
    for var in forecast.data_vars:
        per_lead = []
        for lead in forecast["lead_time"].values:
            fc = forecast[var].sel(lead_time=lead)
            t = truth_at(truth[var], forecast["init_time"].values, lead, f"truth {var}")
            if LEVEL in fc.dims:
                t = t.sel({LEVEL: fc[LEVEL]})
            per_lead.append(rmse(fc, t, time_dims=("init_time",)))
        scores = xr.concat(per_lead, dim="lead_time")
        if LEVEL in scores.dims:
            for lv in scores[LEVEL].values:
                out[f"{var}_{int(lv)}"] = scores.sel({LEVEL: lv}).values.tolist()
        else:
            out[str(var)] = scores.values.tolist()
    return out
