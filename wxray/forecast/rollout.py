"""Autoregressive rollout of a trained forecaster, written in the forecast convention (`init_time`,
`lead_time`, [`member`,] [`level`,] `latitude`, `longitude`) that `jobs/evaluate.py` scores.

Routing draws as an ensemble: the token selection of sample (init i, member m) comes from its own
generator, seeded by the coordinates (m,) of its init (`seeds.py`). Each sample keeps its generator for all
its steps, so member m of init i is the same draws whatever else is forecast in the same run or batch; with
batch_size=1 (one sample per forward) a member recomputed alone is bit-identical. The deterministic forecast
is member 0.
A generative forecaster (`generative = True`, models.EDMForecaster) draws its initial noise, churn and
routing from the same per-sample generator (a RowGenerators), step after step: member m of init i is a
sample of the EDM, fed back as the next step's history.

Forecasts are on the kept grid of `spec.fit` (`data.gridfit`): padded rows/columns are cut from every
step's output, and the next step's input is the kept state padded again, as the reader pads a store
field. Scoring (`verify.lead_scores`) uses the same kept latitudes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import xarray as xr
from tqdm.auto import tqdm

from wxray.data.cf import describe
from wxray.data.schema import INIT, LAT, LEAD, LEVEL, LON, MEMBER, TIME, time_step
from wxray.data.windows import WindowReader, WindowSpec, open_lazy, per_channel, to_physical
from wxray.forecast.seeds import coordinate_generator
from wxray.io import atomic_path
from wxray.models import RandomSelector, RowGenerators, TokenSelector
from wxray.models.batch_invariance import batch_invariant


class PerSampleSelector(TokenSelector):
    """The model's random selector, called once per sample with that sample's generator.

    A selector draws (B, L) keys from one generator, which would tie a sample's draw to its batch
    position; here sample b draws from `generators[b]` alone. Only random selection is wrapped
    (`routing_varies`), and it reads neither the routing context nor a delta gate, so both pass as they are.
    """

    def __init__(self, base: TokenSelector, generators: Sequence[torch.Generator]):
        super().__init__()
        self.base = base
        self.generators = list(generators)
        self.needs_attention = base.needs_attention
        self.training = base.training

    def select(self, x, k, generator=None, context=None):
        if x.shape[0] != len(self.generators):
            raise ValueError(f"{len(self.generators)} routing generators for a batch of {x.shape[0]}")
        return torch.cat([self.base.select(x[b: b + 1], k, g, context) for b, g in enumerate(self.generators)])

    def delta_gate(self, x, indices, context=None):
        return self.base.delta_gate(x, indices, context)


def routing_varies(model: torch.nn.Module) -> bool:
    """Whether different generators give different token selections (random, non-fixed selection)."""
    router = getattr(model, "router", None)
    selector = getattr(router, "selector", None)
    return bool(getattr(router, "sparse", False) and isinstance(selector, RandomSelector)
                and not selector.deterministic)


@contextlib.contextmanager
def per_sample_routing(model: torch.nn.Module, generators: Sequence[torch.Generator]) -> Iterator[None]:
    """Within the block, `model`'s random token selection draws per sample. A no-op where selection draws
    nothing (dense or unrouted models, score-based or fixed selections): those are per-sample already."""
    if not routing_varies(model):
        yield
        return
    router = model.router
    base = router.selector
    router.selector = PerSampleSelector(base, generators)
    try:
        yield
    finally:
        router.selector = base


def _normalise_state(spec: WindowSpec, phys: torch.Tensor) -> torch.Tensor:
    base = spec.target_in_input
    return (phys - per_channel(spec.in_mean[base], phys)) / per_channel(spec.in_std[base], phys)


def one_step_only(spec: WindowSpec) -> str | None:
    """Why a forecast of `spec` cannot be fed back as the next input (a rollout then stops at one step),
    or None when it can: the targets must be the input channels, and with history > 1 the inputs are
    consecutive native steps, which a forecast lead_steps > 1 ahead cannot extend."""
    if [c.name for c in spec.targets] != [c.name for c in spec.inputs]:
        return "a rollout beyond one step needs the targets to be the input variables"
    if spec.history > 1 and spec.lead_steps > 1:
        return ("a rollout beyond one step with history > 1 needs lead_steps = 1 "
                "(the model was trained on consecutive native steps)")
    return None


def check_rollout(spec: WindowSpec, steps: int) -> None:
    """ValueError (`one_step_only`'s reason) unless `spec` can be rolled out `steps` steps."""
    why = one_step_only(spec)
    if steps > 1 and why:
        raise ValueError(why)


def possible_steps(spec: WindowSpec, steps: int) -> int:
    """`steps`, or at most 1 where `check_rollout` would refuse more."""
    return steps if one_step_only(spec) is None else min(steps, 1)


Sample = tuple[int, int]  # (init index into the anchors, member id)


@torch.no_grad()
def batch_steps(model: torch.nn.Module, spec: WindowSpec, reader: WindowReader, anchors: np.ndarray,
                init_times: np.ndarray, batch: Sequence[Sample], steps: int, seed: int = 0,
                device: torch.device | str = "cpu") -> Iterator[np.ndarray]:
    """One batch of samples (init index a, member id m) rolled out from store windows `anchors[a]`, valid at
    `init_times[a]` (the seed's coordinate): yields each
    step's physical forecast on the kept grid, (len(batch), V_out, h, w), step k valid at init + (k+1) * lead.
    Memory is the batch's state, whatever the steps: the caller writes each step away."""
    v, h = len(spec.inputs), spec.history
    rows = np.array([a for a, _ in batch])
    gens = [coordinate_generator(seed, init_times[a], m) for a, m in batch]
    # A generative forecaster draws everything (noise, routing) from per-row generators.
    draws = {"generator": RowGenerators(gens)} if getattr(model, "generative", False) else {}
    with batch_invariant(device), per_sample_routing(model, gens):  # a member's bits do not depend on its batch
        x = torch.from_numpy(reader.inputs(np.asarray(anchors)[rows])).to(device)
        for _ in range(steps):
            phys = spec.unpad(to_physical(spec, model(x, **draws).float(), x))
            yield phys.cpu().numpy()
            state = _normalise_state(spec, spec.pad(phys))
            x = torch.cat([x[:, v: h * v], state, x[:, h * v:]], dim=1)


def channel_groups(channels: Sequence) -> list[tuple[str, list[int], list | None]]:
    """(variable, channel indices, levels or None) of `channels` (a spec's inputs or targets), in their order:
    how a channel list becomes the forecast convention's variables, each with its `level` dim or none."""
    groups = []
    for var in dict.fromkeys(c.variable for c in channels):
        idx = [i for i, c in enumerate(channels) if c.variable == var]
        levels = [channels[i].level for i in idx]
        groups.append((var, idx, None if levels[0] is None else levels))
    return groups


def samples_of(n_init: int, members: Sequence[int] | None) -> list[Sample]:
    """Every (init index, member id) of a forecast, init by init (member 0 alone without `members`)."""
    ids = [0] if members is None else [int(m) for m in members]
    return [(a, m) for a in range(n_init) for m in ids]


@torch.no_grad()
def rollout(model: torch.nn.Module, spec: WindowSpec, anchors: np.ndarray, steps: int, seed: int = 0,
            batch_size: int = 8, members: Sequence[int] | None = None,
            device: torch.device | str = "cpu") -> np.ndarray:
    """Physical forecasts on the kept grid, step k valid at anchor + (k+1) * lead:
    (n_init, steps, V_out, h, w), or (n_init, len(members), steps, V_out, h, w) for `members`.

    The whole forecast in memory, for a few inits: the forecast job writes batch by batch instead
    (`forecast.output`). Only the inputs of each init are read, so an init needs no truth after it. A batch
    holds `batch_size` (init, member) samples.
    """
    check_rollout(spec, steps)
    model.eval()
    reader = WindowReader(spec)
    init_times = open_lazy(spec.store)[TIME].values[anchors]
    ids = [0] if members is None else [int(m) for m in members]
    out = np.zeros((len(anchors), len(ids), steps, len(spec.targets), *spec.kept_grid), np.float32)
    col = {m: j for j, m in enumerate(ids)}
    samples = samples_of(len(anchors), ids)
    for start in tqdm(range(0, len(samples), batch_size), desc="rollout"):
        batch = samples[start: start + batch_size]
        rows, cols = np.array([a for a, _ in batch]), np.array([col[m] for _, m in batch])
        for k, phys in enumerate(batch_steps(model, spec, reader, anchors, init_times, batch, steps, seed, device)):
            out[rows, cols, k] = phys
    return out[:, 0] if members is None else out


def to_forecast_dataset(fc: np.ndarray, spec: WindowSpec, ds: xr.Dataset, anchors: np.ndarray,
                        members: Sequence[int] | None = None) -> xr.Dataset:
    """Forecast-convention dataset: one variable per target variable, `level` where the store has it,
    `member` when `members` is given (fc then has the member axis of `rollout`). Units from the store."""
    if members is not None:
        fc = np.moveaxis(fc, 1, 2)  # (init, lead, member, V, h, w)
    step = time_step(ds) * spec.lead_steps
    leads = pd.to_timedelta([step * (k + 1) for k in range(fc.shape[1])])
    coords = {INIT: ds[TIME].values[anchors], LEAD: leads, LAT: spec.latitude, LON: spec.longitude}
    lead_dims = (INIT, LEAD) if members is None else (INIT, LEAD, MEMBER)
    if members is not None:
        coords[MEMBER] = np.asarray(members, dtype=np.int64)
    data = {}
    for var, idx, levels in channel_groups(spec.targets):
        if levels is None:
            da = xr.DataArray(fc[..., idx[0], :, :], dims=(*lead_dims, LAT, LON), coords=coords)
        else:
            da = xr.DataArray(fc[..., idx, :, :], dims=(*lead_dims, LEVEL, LAT, LON), coords={**coords, LEVEL: levels})
        da.attrs = {k: ds[var].attrs[k] for k in ("units", "long_name") if k in ds[var].attrs}
        data[var] = da
    out = xr.Dataset(data, coords=coords)
    out.attrs.update(source="wxray rollout", grid_fit=spec.fit.mode,
                     routing_members=1 if members is None else len(members))
    return out


def write_forecast(forecast: xr.Dataset, path: str | Path) -> Path:
    """Atomically, as zarr v2 with consolidated metadata (as WeatherBench 2 / ARCO-ERA5 stores are), so a
    plain `xr.open_zarr(path)` opens it in one metadata read and without a warning; CF attributes added."""
    with atomic_path(path) as tmp:
        describe(forecast).drop_encoding().to_zarr(tmp, zarr_format=2, consolidated=True)
    return Path(path)
