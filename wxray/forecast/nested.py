"""The one nested-ensemble engine: work units (init t, encoder draw i) -> their N x R members, for
`jobs/forecast_e2e.py` (units batched in one process), `jobs/ensemble.py` and `jobs/ose.py` (units fanned out
on Ray actors, `ensemble/actors.py`).

A unit encodes once (noise draw i), tiles the analysis to N x R rows and rolls them out together: row
j * R + k is dropout member j, routing member k. Several units go through one forward as consecutive row
blocks (`run_units`). Every draw comes from a generator seeded by its coordinates (`seeds.py`):

    encoder noise of (t, i)           (ENCODER, i)
    dropout masks of (t, i, j)        (DROPOUT, i, j)       shared by the R rows (t, i, j, .)
    token routing of (t, i, j, k)     (ROUTING, i, j, k)

Each generator advances lead step by lead step, in order, so a unit's members do not depend on which other
units are computed with it. A unit computed alone (`run_unit`, as the actors do) is bit-identical whatever
actor computes it, before or after a restart (same device type, same thread count); in a batch of units the
values agree to float round-off (the matrix kernels sum in another order for another batch shape). A denial
run (`deny=[...]`) shares every draw with its baseline. The levels nest: members (i, j, 0..R-1) share their
dropout masks and differ only in the routing, (i, 0..N-1, .) share the analysis. With R = 1 the routing draw
of (t, i, j, 0) varies with j: the dropout level then carries the routing spread too.

With `keep_members=False` a unit returns only its sufficient statistics (`verify.anova.group_moments`), so
what travels to the driver does not grow with N x R.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
import xarray as xr

from wxray.config import PosInt
from wxray.data.schema import INIT, LEAD, MEMBER
from wxray.data.windows import WindowSpec
from wxray.forecast.seeds import DROPOUT, ENCODER, ROUTING, coordinate_seed
from wxray.forecast.stages import StationSet
from wxray.forecast.state import next_state, obs_of, physical, processor_input
from wxray.models import RowGenerators, mc_dropout, tile_members
from wxray.verify.anova import DROPOUT_DRAW, ENCODER_DRAW, MOMENT, ROUTING_DRAW, group_moments


@dataclass
class Members:
    """The nested design as every job spells it (`members.M`, `members.N`, `members.R`)."""

    M: PosInt = 1  # encoder noise draws (the stochastic encoder of jobs/finetune_stochastic.py stage=encoder)
    N: PosInt = 1  # MC-dropout members per encoder draw (the finetuned stochastic processor, or dropout > 0)


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
    return batch_generators(plan, [(init_time, i)], device)


def batch_generators(plan: Plan, units: Sequence[tuple[np.datetime64, int]], device) -> tuple[RowGenerators, ...]:
    """The generators of consecutive units (t, i): one noise generator per unit, masks and routing per row."""
    n, r, s = plan.members_n, plan.members_r, plan.seed
    noise = RowGenerators.from_seeds([coordinate_seed(s, t, ENCODER, i) for t, i in units], device=device)
    masks = RowGenerators.from_seeds([coordinate_seed(s, t, DROPOUT, i, j) for t, i in units
                                      for j in range(n) for _ in range(r)], device=device)
    routes = RowGenerators.from_seeds([coordinate_seed(s, t, ROUTING, i, j, k) for t, i in units
                                       for j in range(n) for k in range(r)], device=device)
    return noise, masks, routes


def run_unit(models: UnitModels, inputs: dict[str, np.ndarray], init_time: np.datetime64, i: int, plan: Plan,
             device="cpu") -> dict[str, np.ndarray]:
    """Members of unit (t, i): `fields` (leads + 1, N, R, V, h, w) physical on the kept grid, lead 0 the
    analysis, and `stations` (leads + 1, N, R, S, V_station) when the models decode stations; with
    `plan.keep_members=False` their moments instead. `inputs` are E2EReader.inputs of the one init t."""
    out = run_units(models, inputs, [(init_time, i)], [0], plan, device)[0]
    return out if plan.keep_members else {k: unit_moments(a, plan.members_r) for k, a in out.items()}


@torch.no_grad()
def run_units(models: UnitModels, inputs: dict[str, np.ndarray], units: Sequence[tuple[np.datetime64, int]],
              rows: Sequence[int], plan: Plan, device="cpu") -> list[dict[str, np.ndarray]]:
    """Members of several units (t, i) in one forward: unit u reads row `rows[u]` of `inputs` (E2EReader.inputs
    of the units' inits). One {"fields", "stations"} as `run_unit` gives (members kept) per unit."""
    spec, v = models.spec, len(models.spec.inputs)
    n, r, u = plan.members_n, plan.members_r, len(units)
    b = {k: torch.from_numpy(np.asarray(a)[list(rows)]).to(device) for k, a in inputs.items()}
    noise, masks, routes = batch_generators(plan, units, device)
    z = models.encoder(obs_of(b), b["static"], deny=plan.deny, noise_generator=noise)
    z, x = tile_members(z, n * r), tile_members(b["x"], n * r)
    fields = np.zeros((u, plan.lead_steps + 1, n, r, v, *spec.kept_grid), np.float32)
    stations = None
    if models.decoder is not None and models.stations is not None:
        s = models.stations
        stations = np.zeros((u, plan.lead_steps + 1, n, r, len(s.coords), len(s.mean)), np.float32)
    for k in range(plan.lead_steps + 1):
        if k:
            step = models.processor(processor_input(z, x, v), generator=masks, routing_generator=routes)
            z = next_state(spec, z, step)
        fields[:, k] = physical(spec, z.cpu()).numpy().reshape(u, n, r, v, *spec.kept_grid)
        if stations is not None:
            stations[:, k] = models.stations.decode(models.decoder, z).numpy().reshape(u, n, r, *stations.shape[4:])
    return [{"fields": fields[q], **({"stations": stations[q]} if stations is not None else {})} for q in range(u)]


def nested_members(forecast: xr.Dataset, members_m: int, members_n: int) -> xr.Dataset:
    """A `member` dim of M*N (index i*N + j) as (encoder_draw, dropout_draw); with M or N = 1 the single
    branch stays a plain `member` dim (a one-entry group dim would have no variance to split)."""
    if members_m == 1 or members_n == 1:
        return forecast
    index = pd.MultiIndex.from_product([range(members_m), range(members_n)], names=[ENCODER_DRAW, DROPOUT_DRAW])
    out = forecast.assign_coords(xr.Coordinates.from_pandas_multiindex(index, MEMBER)).unstack(MEMBER)
    return out.transpose(INIT, LEAD, ENCODER_DRAW, DROPOUT_DRAW, ...)


def unit_moments(members: np.ndarray, r: int) -> np.ndarray:
    """(lead, N, R, ...) members of one encoder draw -> float64 (lead, moment, ...) sufficient statistics."""
    dims = [f"d{k}" for k in range(members.ndim - 3)]
    da = xr.DataArray(members.astype(np.float64), dims=(LEAD, DROPOUT_DRAW, ROUTING_DRAW, *dims))
    replicate = (DROPOUT_DRAW, ROUTING_DRAW) if r > 1 else (DROPOUT_DRAW,)
    if r == 1:
        da = da.isel({ROUTING_DRAW: 0})
    return group_moments(da, replicate).transpose(LEAD, MOMENT, *dims).values
