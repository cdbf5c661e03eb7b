"""One work unit of a batch ensemble (`jobs/ensemble.py`): init t and encoder draw i -> its N x R members.

The unit encodes once (noise draw i), tiles the analysis to N x R rows and rolls them out together: row
j * R + k is dropout member j, routing member k. Every draw comes from a generator seeded by its
coordinates (common random numbers), never from an actor's or a process's RNG state:

    encoder noise of (t, i)           SeedSequence([seed, t in seconds, 1, i])
    dropout masks of (t, i, j)        SeedSequence([seed, t in seconds, 2, i, j])   shared by the R rows (t, i, j, .)
    token routing of (t, i, j, k)     SeedSequence([seed, t in seconds, 3, i, j, k])

Each generator advances lead step by lead step, in order. So a unit computed by any actor, alone or beside
others, before or after a restart, is bit-identical (same device type, same thread count); and a denial run
(`deny=[...]`) shares every draw with its baseline. The levels nest: members (i, j, 0..R-1) share their
dropout masks and differ only in the routing, (i, 0..N-1, .) share the analysis. With R = 1 the routing draw
of (t, i, j, 0) varies with j: the dropout level then carries the routing spread too.

With `keep_members=False` the unit returns only its sufficient statistics (`verify.anova.group_moments`), so
what travels to the driver does not grow with N x R.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import xarray as xr

from wxray.data.schema import LEAD
from wxray.data.windows import WindowSpec
from wxray.models import RowGenerators, mc_dropout, tile_members
from wxray.platform.inference.nested import DROPOUT_SOURCE, ENCODER_SOURCE, ROUTING_SOURCE, draw_seed
from wxray.platform.train.stage_eval import physical
from wxray.platform.train.stages import StationSet, next_state, obs_of, processor_input
from wxray.verify.anova import DROPOUT_DRAW, MOMENT, ROUTING_DRAW, group_moments


@dataclass(frozen=True)
class Plan:
    """What every unit of a run computes: members, leads, seed, denied streams, dropout, what to return."""

    members_m: int
    members_n: int
    members_r: int
    lead_steps: int
    seed: int
    deny: tuple[str, ...] = ()
    dropout: float = 0.0
    keep_members: bool = True


@dataclass
class UnitModels:
    """What a worker holds: the stochastic encoder, the processor, optionally the decoder and its stations."""

    spec: WindowSpec
    encoder: torch.nn.Module
    processor: torch.nn.Module
    decoder: torch.nn.Module | None = None
    stations: StationSet | None = None

    def to(self, device) -> UnitModels:
        for m in (self.encoder, self.processor, self.decoder):
            if m is not None:
                m.to(device)
        return self

    def prepare(self, dropout: float) -> UnitModels:
        """Inference mode: everything in eval but the processor's dropout at rate `dropout` (if > 0)."""
        self.encoder.eval()
        if dropout > 0:
            mc_dropout(self.processor, dropout)
        else:
            self.processor.eval()
        if self.decoder is not None:
            self.decoder.eval()
        return self


def unit_generators(plan: Plan, init_time: np.datetime64, i: int, device) -> tuple[RowGenerators, ...]:
    """(noise of (t, i), masks and routing of the N x R rows j * R + k), seeded from their coordinates."""
    n, r = plan.members_n, plan.members_r
    noise = RowGenerators.from_seeds([draw_seed(plan.seed, init_time, ENCODER_SOURCE, i)], device=device)
    masks = RowGenerators.from_seeds([draw_seed(plan.seed, init_time, DROPOUT_SOURCE, i, j)
                                      for j in range(n) for _ in range(r)], device=device)
    routes = RowGenerators.from_seeds([draw_seed(plan.seed, init_time, ROUTING_SOURCE, i, j, k)
                                       for j in range(n) for k in range(r)], device=device)
    return noise, masks, routes


@torch.no_grad()
def run_unit(models: UnitModels, inputs: dict[str, np.ndarray], init_time: np.datetime64, i: int, plan: Plan,
             device="cpu") -> dict[str, np.ndarray]:
    """Members of unit (t, i): `fields` (leads + 1, N, R, V, h, w) physical on the kept grid, lead 0 the
    analysis, and `stations` (leads + 1, N, R, S, V_station) when the models decode stations. `inputs` are
    E2EReader.inputs of the one init t."""
    spec, v = models.spec, len(models.spec.inputs)
    n, r = plan.members_n, plan.members_r
    b = {k: torch.from_numpy(np.asarray(a)).to(device) for k, a in inputs.items()}
    noise, masks, routes = unit_generators(plan, init_time, i, device)
    z = models.encoder(obs_of(b), b["static"], deny=plan.deny, noise_generator=noise)
    z, x = tile_members(z, n * r), tile_members(b["x"], n * r)
    fields = np.zeros((plan.lead_steps + 1, n, r, v, *spec.kept_grid), np.float32)
    stations = None
    if models.decoder is not None and models.stations is not None:
        s = models.stations
        stations = np.zeros((plan.lead_steps + 1, n, r, len(s.coords), len(s.mean)), np.float32)
    for k in range(plan.lead_steps + 1):
        if k:
            step = models.processor(processor_input(z, x, v), generator=masks, routing_generator=routes)
            z = next_state(spec, z, step)
        fields[k] = physical(spec, z.cpu()).numpy().reshape(n, r, v, *spec.kept_grid)
        if stations is not None:
            stations[k] = models.stations.decode(models.decoder, z).numpy().reshape(n, r, *stations.shape[3:])
    out: dict[str, Any] = {"fields": fields}
    if stations is not None:
        out["stations"] = stations
    return out if plan.keep_members else {k: unit_moments(a, r) for k, a in out.items()}


def unit_moments(members: np.ndarray, r: int) -> np.ndarray:
    """(lead, N, R, ...) members of one encoder draw -> float64 (lead, moment, ...) sufficient statistics."""
    dims = [f"d{k}" for k in range(members.ndim - 3)]
    da = xr.DataArray(members.astype(np.float64), dims=(LEAD, DROPOUT_DRAW, ROUTING_DRAW, *dims))
    replicate = (DROPOUT_DRAW, ROUTING_DRAW) if r > 1 else (DROPOUT_DRAW,)
    if r == 1:
        da = da.isel({ROUTING_DRAW: 0})
    return group_moments(da, replicate).transpose(LEAD, MOMENT, *dims).values
