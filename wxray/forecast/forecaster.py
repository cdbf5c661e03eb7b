"""A checkpoint's forecast, made, written and scored one way for both places that make one: the training
job's evaluation of its final checkpoint (evaluation.py) and the forecast job (forecast.py).

    model = load_forecaster(ckpt, model_cfg, spec)      # before the job starts: bad input is one line
    run = forecast_and_score(model, spec, ds, anchors, steps, out_dir, tracker, seed=..., batch_size=...)

`forecast_and_score` rolls the model out from `anchors` (rollout.py) batch by batch, each batch of (init,
member) samples written into `<out_dir>/forecast.zarr` lead chunk by lead chunk as it is made (`output.py`:
laid out first, resumable), so memory is one batch whatever the inits, members and leads. A `runner` decides
where the batches run: `in_process` here, or Ray actors holding the model, all writing into the one store
(`wxray.platform.cluster.replicas`). Then it scores, per lead and beside persistence (`verify.lead_scores`),
the inits whose truth is in the store at every lead (`rollout_anchors`), logging those scores to MLflow. Its
`report` is the `rollout` entry of RESULT, {} when no init has that truth.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import xarray as xr
from tqdm.auto import tqdm

from wxray.console import say
from wxray.data.anchors import rollout_anchors
from wxray.data.schema import INIT, MEMBER, TIME, open_climatology, time_step
from wxray.data.windows import WindowReader, WindowSpec
from wxray.errors import ConfigError
from wxray.forecast import checkpoints
from wxray.forecast.output import ForecastLayout, ForecastStore
from wxray.forecast.rollout import Sample, batch_steps, check_rollout
from wxray.models.registry import ModelConfig, SamplerConfig, as_forecaster, build_forecaster, model_identity
from wxray.verify.lead_scores import log_report, rollout_report


def load_forecaster(ckpt: str | Path, model_cfg: ModelConfig, spec: WindowSpec,
                    sampler: SamplerConfig | None = None) -> torch.nn.Module:
    """The forecaster of `model_cfg` on `spec` with the weights of checkpoint `ckpt`, which must have been
    trained with that model and those channels (CheckpointError otherwise; ConfigError for a model that
    cannot be built on this grid). A generative model comes wrapped with `sampler` (default settings if None)."""
    state, _ = checkpoints.load(ckpt, expect_model=model_identity(model_cfg, spec))
    try:
        model = build_forecaster(model_cfg, spec)
    except ValueError as e:
        raise ConfigError(f"checkpoint {ckpt}: {e}") from None
    checkpoints.load_model_weights(model, state, str(ckpt))
    return as_forecaster(model, model_cfg, sampler or SamplerConfig())


class BatchWriter:
    """A worker's share of a forecast: batches of (init, member) samples rolled out and written into the
    store as each lead chunk is made (`forecast.output`). Pickles whole (model included) to a Ray actor,
    which moves it to its device with `to`; `__call__(batch)` returns the batch once every lead is written."""

    def __init__(self, model: torch.nn.Module, spec: WindowSpec, store: ForecastStore, anchors: np.ndarray,
                 steps: int, seed: int, device: torch.device | str = "cpu"):
        self.model, self.spec, self.store = model.eval(), spec, store
        self.anchors, self.steps, self.seed, self.device = np.asarray(anchors), steps, seed, device
        self._reader: WindowReader | None = None

    def to(self, device: torch.device | str) -> BatchWriter:
        self.model, self.device = self.model.to(device), device
        return self

    def __call__(self, batch: list[Sample]) -> list[Sample]:
        if self._reader is None:
            self._reader = WindowReader(self.spec)
        chunk, k0, buf = self.store.layout.lead_chunk, 0, []
        for k, phys in enumerate(batch_steps(self.model, self.spec, self._reader, self.anchors,
                                             self.store.layout.init_times, batch, self.steps, self.seed,
                                             self.device)):
            buf.append(phys)
            if len(buf) == chunk or k == self.steps - 1:
                self.store.write(batch, k0, np.stack(buf, axis=1))
                k0, buf = k + 1, []
        return batch


CPU_BATCH, MAX_BATCH = 8, 64


def auto_batch_size(model: torch.nn.Module, spec: WindowSpec, anchors: np.ndarray, device: torch.device | str,
                    budget: float = 0.5) -> int:
    """`batch_size=0`: on a GPU, as many samples (at most MAX_BATCH) as `budget` of its free memory holds, the
    memory of one sample measured by one step of the first init; on the CPU CPU_BATCH (a bigger batch gains
    little there, and memory is the host's)."""
    device = torch.device(device)
    if device.type != "cuda":
        return CPU_BATCH
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    times = np.array([np.datetime64("1970-01-01", "s")])
    next(batch_steps(model.eval(), spec, WindowReader(spec), anchors[:1], times, [(0, 0)], 1, 0, device))
    one = max(torch.cuda.max_memory_allocated(device) - base, 1)
    free, _ = torch.cuda.mem_get_info(device)
    return int(max(1, min(MAX_BATCH, budget * free // one)))


Runner = Callable[[BatchWriter, list[list[Sample]]], Iterable[list[Sample]]]


def in_process(writer: BatchWriter, batches: list[list[Sample]]) -> Iterator[list[Sample]]:
    """The batches one after the other in this process (the runner without Ray)."""
    for batch in batches:
        yield writer(batch)


@dataclass
class ForecastRun:
    forecast: xr.Dataset  # forecast convention, every init of `anchors`, opened lazily from `path`
    path: Path  # <out_dir>/forecast.zarr
    scored: np.ndarray  # the anchors with truth at every lead, the inits `report` scores
    report: dict[str, Any]  # verify.lead_scores.rollout_report of the scored inits; {} when there are none


def forecast_layout(spec: WindowSpec, ds: xr.Dataset, anchors: np.ndarray, steps: int,
                    members: Sequence[int] | None, attrs: dict[str, Any] | None) -> ForecastLayout:
    step = time_step(ds) * spec.lead_steps
    keep = ("units", "long_name")
    var_attrs = {c.variable: {k: str(ds[c.variable].attrs[k]) for k in keep if k in ds[c.variable].attrs}
                 for c in spec.targets}
    return ForecastLayout(spec, ds[TIME].values[anchors], pd.to_timedelta([step * (k + 1) for k in range(steps)]),
                          None if members is None else tuple(int(m) for m in members), var_attrs, dict(attrs or {}))


def forecast_and_score(model: torch.nn.Module, spec: WindowSpec, ds: xr.Dataset, anchors: np.ndarray, steps: int,
                       out_dir: str | Path, tracker, *, seed: int, batch_size: int,
                       members: Sequence[int] | None = None, device: torch.device | str = "cpu",
                       attrs: dict[str, Any] | None = None, runner: Runner = in_process,
                       on_written: Callable[[], None] | None = None) -> ForecastRun:
    """Rollout into forecast.zarr (with `attrs`), batch by batch through `runner`, continuing a stopped run's
    store; then per-lead scores logged to `tracker`. See the module docstring. `on_written()` is called once
    the first batch is in (the job keeps its run directory on a failure from then on: a re-run continues)."""
    check_rollout(spec, steps)
    store = ForecastStore(out_dir, forecast_layout(spec, ds, anchors, steps, members, attrs))
    done = store.open()
    samples = store.layout.samples()
    todo = [s for s in samples if s not in done]
    if done and todo:
        say(f"{store.partial}: {len(done)} of {len(samples)} sample(s) written by an earlier run, continuing")
    batches = [todo[i: i + batch_size] for i in range(0, len(todo), batch_size)]
    writer = BatchWriter(model, spec, store, anchors, steps, seed, device)
    with tqdm(total=len(samples), initial=len(samples) - len(todo), desc="rollout", unit="sample") as bar:
        for batch in runner(writer, batches):
            store.record(batch)
            bar.update(len(batch))
            if on_written is not None:
                on_written()
    path = store.finish()
    forecast = xr.open_zarr(path)
    scored = rollout_anchors(ds, anchors, spec, steps)
    report: dict[str, Any] = {}
    if len(scored):
        sel = forecast.sel({INIT: ds[TIME].values[scored]})
        with tempfile.TemporaryDirectory(dir=out_dir, prefix=".ensemble_mean") as tmp:
            report = rollout_report(sel, ds, open_climatology(spec.store), mean=_ensemble_mean(sel, Path(tmp)))
        log_report(report, tracker)
    return ForecastRun(forecast, path, scored, report)


def _ensemble_mean(forecast: xr.Dataset, tmp: Path) -> xr.Dataset | None:
    """The member mean in float64, written chunk by chunk into `tmp` (each member chunk read once, all its
    leads at a time) and opened from there; the per-lead scores then read no member. None without members."""
    if MEMBER not in forecast.dims:
        return None
    mean = forecast.astype(np.float64).mean(MEMBER)
    mean.drop_encoding().to_zarr(tmp / "mean.zarr", zarr_format=2, consolidated=True)
    return xr.open_zarr(tmp / "mean.zarr")
