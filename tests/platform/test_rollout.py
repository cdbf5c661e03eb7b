"""Autoregressive rollout: de/normalisation and the history shift, checked against persistence."""

from __future__ import annotations

import numpy as np
import torch

from wxray.data.schema import open_stats, open_store
from wxray.platform.rollout import rollout, score_per_lead, to_forecast_dataset
from wxray.platform.windows import WindowConfig, make_spec


class ZeroTendency(torch.nn.Module):
    """Predicts 'no change': the normalised tendency whose physical value is exactly 0."""

    def __init__(self, spec):
        super().__init__()
        self.value = torch.as_tensor(-spec.out_mean / spec.out_std)[None, :, None, None]

    def forward(self, x, generator=None):
        return self.value.expand(x.shape[0], -1, *x.shape[-2:]).clone()


class Shift(torch.nn.Module):
    """Outputs the normalised input channel of the *previous* step: exposes a wrong history shift."""

    def __init__(self, spec):
        super().__init__()
        self.spec = spec

    def forward(self, x, generator=None):
        v = len(self.spec.inputs)
        prev = x[:, :v] * torch.as_tensor(self.spec.in_std)[None, :, None, None] \
            + torch.as_tensor(self.spec.in_mean)[None, :, None, None]
        last = x[:, v: 2 * v] * torch.as_tensor(self.spec.in_std)[None, :, None, None] \
            + torch.as_tensor(self.spec.in_mean)[None, :, None, None]
        tendency = prev - last  # next state = the state one step before the last
        return (tendency - torch.as_tensor(self.spec.out_mean)[None, :, None, None]) \
            / torch.as_tensor(self.spec.out_std)[None, :, None, None]


def test_zero_tendency_rollout_is_persistence_and_scores_match(tiny_store):
    path, ds = tiny_store
    store = open_store(path)
    spec = make_spec(str(path), store, open_stats(path), WindowConfig(history=2, lead_steps=1, residual=True))
    anchors = np.array([3, 15, 27])
    fc = rollout(ZeroTendency(spec), spec, anchors, steps=3)
    z = ds.geopotential.sel(level=850).values
    ch = [c.name for c in spec.targets].index("geopotential_850")
    for k in range(3):
        np.testing.assert_allclose(fc[:, k, ch], z[anchors], rtol=1e-5)
    forecast = to_forecast_dataset(fc, spec, store, anchors)
    assert forecast["lead_time"].values.astype("timedelta64[h]").astype(int).tolist() == [6, 12, 18]
    scores = score_per_lead(forecast, store)
    w = np.cos(np.deg2rad(ds.latitude.values))
    for k in range(3):
        err = (z[anchors] - z[anchors + k + 1]) ** 2
        expected = np.sqrt(np.mean([np.average(e.mean(-1), weights=w) for e in err]))
        np.testing.assert_allclose(scores["geopotential_850"][k], expected, rtol=0.02)


def test_history_shifts_by_one_step_each_lead(tiny_store):
    path, ds = tiny_store
    store = open_store(path)
    spec = make_spec(str(path), store, open_stats(path), WindowConfig(history=2, lead_steps=1, residual=True,
                                                                       constants=["land_sea_mask"]))
    a = np.array([5])
    fc = rollout(Shift(spec), spec, a, steps=3)
    z = ds.temperature.sel(level=500).values
    ch = [c.name for c in spec.targets].index("temperature_500")
    # states: s4, s5 -> s4 -> s5 -> s4 (each prediction repeats the state before the last)
    np.testing.assert_allclose(fc[0, 0, ch], z[4], rtol=1e-5)
    np.testing.assert_allclose(fc[0, 1, ch], z[5], rtol=1e-5)
    np.testing.assert_allclose(fc[0, 2, ch], z[4], rtol=1e-5)
