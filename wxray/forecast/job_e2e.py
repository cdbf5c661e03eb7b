"""The end-to-end forecast job (`jobs/forecast_e2e.py`): observations -> analysis -> rollout -> stations.

    python jobs/forecast_e2e.py stages=runs/train_e2e/e2e steps=4
    python jobs/forecast_e2e.py stages=runs/train_e2e/e2e deny=[stations]      # an observing-system denial
    python jobs/evaluate.py forecast=<out>/forecast.zarr truth=<store> stations=<out>/stations.parquet \
        station_obs=<obs dir> station_baseline=bilinear

`stages` is the directory `jobs/train_e2e.py` wrote the stages of one chain into. The analysis and the
steps come from the `chain` stage when it exists, else from the `encoder` and `processor` stages; station
forecasts from the `decoder` stage (skipped, with a line saying so, when there is none). Outputs:

    forecast.zarr     forecast convention (init_time, lead_time, latitude, longitude), lead 0 = the analysis
    stations.parquet  init_time, lead_time (hours), station, latitude, longitude, variable, value: the decoder
                      at every station of the station stream, every lead

Scores in RESULT: per lead RMSE/ACC beside persistence of the true state (`verify.lead_scores`) for inits with
truth at every lead, and station RMSE/bias/MAE per lead beside bilinear interpolation of the gridded forecast.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import pandas as pd
import torch

from wxray.config import InPath, PosInt, Range, RunsDir, Seed
from wxray.console import say
from wxray.data.anchors import choose_inits, parse_range, rollout_anchors
from wxray.data.e2e_windows import E2EData, E2EReader
from wxray.data.schema import INIT, LEAD, TIME, open_climatology, open_store
from wxray.forecast.chain import inputs_used, load_chain, load_stochastic, station_table
from wxray.forecast.job import resolve_device
from wxray.forecast.mlflow_model import local_stages
from wxray.forecast.nested import Members, Plan, UnitModels, nested_members, run_units
from wxray.forecast.rollout import to_forecast_dataset, write_forecast
from wxray.forecast.seeds import ROUTING, coordinate_seed
from wxray.forecast.stages import StationSet
from wxray.forecast.state import next_state, obs_of, physical, processor_input
from wxray.io import atomic_path
from wxray.job import JobConfig, JobContext
from wxray.models import RowGenerators
from wxray.models.batch_invariance import batch_invariant
from wxray.tracking import resolve_uri
from wxray.verify.lead_scores import log_report, rollout_report
from wxray.verify.stations import station_report

SEED_NOTE = "noise SeedSequence([seed, t, 1, i]); masks [seed, t, 2, i, j]; routing [seed, t, 3, i, j, 0]"


@dataclass
class ForecastE2EConfig(JobConfig):
    stages: RunsDir = "runs/train_e2e/e2e"  # stages folder of jobs/train_e2e.py (or a URL, models:/...)
    store: InPath = ""  # "" = the store the stages were trained on
    obs_dir: InPath = ""  # "" = the observation streams the stages were trained on
    inits: str = ""  # "start/end" init times, inclusive; "" = the test split with truth at every lead
    steps: PosInt = 4  # processor steps after the analysis (lead 0)
    deny: list[str] = field(default_factory=list)  # streams withheld from the encoder (observing-system denial)
    members: Members = field(default_factory=Members)  # the nested M x N ensemble; M = N = 1: deterministic
    dropout: Annotated[float, Range(-1, 1, hi_open=True)] = -1.0  # inference dropout p; -1 = as finetuned
    seed: Seed = 0  # every draw of init t from its coordinates: SeedSequence([seed, t, source, ...]) (seeds.py)
    batch_size: PosInt = 8  # inits per forward (each with its M x N members)
    device: str = "auto"  # auto (a GPU when there is one), cpu, cuda, cuda:1; must exist on this machine

    experiment = "wxray-forecast"
    columns = ("rollout/rmse/*",)  # at the last lead (the step)
    renamed = {"members_m": "members.M", "members_n": "members.N"}  # one release

    def run_label(self, job: str) -> str:
        m, n = self.members.M, self.members.N
        return "e2e" + (f"-{m}x{n}" if m * n > 1 else "") + ("-deny-" + "-".join(self.deny) if self.deny else "")

    def validate(self) -> None:
        if self.inits:
            parse_range(self.inits, "inits")
        resolve_device(self.device)


@torch.no_grad()
def run_forecast(data: E2EData, encoder, processor, decoder, anchors: np.ndarray, steps: int, deny, batch_size: int,
                 device, init_times: np.ndarray, seed: int = 0) -> tuple[np.ndarray, np.ndarray | None]:
    """(n_init, steps + 1, V, kept grid) physical states, lead 0 the analysis; station values (n_init, steps + 1,
    n_station, V_station) in physical units, or None without a decoder. A processor that routes tokens at random
    draws its selection of init t from the coordinates (ROUTING,) of t (`seeds.py`), lead step by lead step: the
    forecast of any init is reproducible alone, whatever the global RNG's state."""
    spec, n = data.spec, len(data.spec.inputs)
    reader = E2EReader(data.spec, data.obs)
    out = np.zeros((len(anchors), steps + 1, n, *spec.kept_grid), np.float32)
    stations = station_table(data) if decoder is not None else None
    st, at = None, None
    if stations is not None:
        at = StationSet.of(data, stations)
        st = np.zeros((len(anchors), steps + 1, len(stations), len(data.station_variables)), np.float32)
    for m in (encoder, processor, decoder):
        if m is not None:
            m.to(device)
    for i in range(0, len(anchors), batch_size):
        rows = slice(i, i + batch_size)
        b = {k: torch.from_numpy(np.asarray(v)).to(device) for k, v in reader.inputs(anchors[rows]).items()}
        routes = RowGenerators.from_seeds([coordinate_seed(seed, t, ROUTING) for t in init_times[rows]])
        z = encoder(obs_of(b), b["static"], deny=tuple(deny))
        for k in range(steps + 1):
            if k:
                z = next_state(spec, z, processor(processor_input(z, b["x"], n), generator=routes))
            out[rows, k] = physical(spec, z.cpu()).numpy()
            if st is not None:
                st[rows, k] = at.decode(decoder, z).numpy()
    return out, (None if st is None else (stations, st))


def run_members(models: UnitModels, data: E2EData, anchors: np.ndarray, plan: Plan, batch_size: int,
                device) -> tuple[np.ndarray, np.ndarray | None]:
    """The nested ensemble by the one engine (`nested.run_units`), `batch_size` inits (each with its M units) per
    forward: (n_init, M*N, steps + 1, V, kept grid) physical states, member index i*N + j, lead 0 the analyses,
    and the station ensemble means (n_init, steps + 1, S, V_station) or None without a decoder."""
    spec, m, n = data.spec, plan.members_m, plan.members_n
    reader = E2EReader(data.spec, data.obs)
    times = reader.times(anchors)
    out = np.zeros((len(anchors), m * n, plan.lead_steps + 1, len(spec.inputs), *spec.kept_grid), np.float32)
    st = None
    if models.stations is not None and models.decoder is not None:
        st = np.zeros((len(anchors), plan.lead_steps + 1, len(models.stations.coords), len(models.stations.mean)),
                      np.float32)
    for a0 in range(0, len(anchors), batch_size):
        rows = list(range(a0, min(len(anchors), a0 + batch_size)))
        coords = [(a, i) for a in rows for i in range(m)]
        units = run_units(models, reader.inputs(anchors[rows]), [(times[a], i) for a, i in coords],
                          [a - a0 for a, _ in coords], plan, device)
        for (a, i), unit in zip(coords, units, strict=True):
            out[a, i * n:(i + 1) * n] = np.moveaxis(unit["fields"][:, :, 0], 1, 0)  # (N, leads + 1, V, h, w)
            if st is not None:
                st[a] += unit["stations"][:, :, 0].sum(axis=1) / (m * n)
    return out, st


def write_stations(path: Path, stations: pd.DataFrame, values: np.ndarray, init_times: np.ndarray,
                   lead_hours: list[int], variables: list[str]) -> Path:
    n_init, n_lead, n_st, n_var = values.shape
    idx = np.indices(values.shape).reshape(4, -1)
    df = pd.DataFrame({
        INIT: init_times[idx[0]], LEAD: np.asarray(lead_hours, np.int32)[idx[1]],
        "station": stations["station"].to_numpy()[idx[2]],
        "latitude": stations["latitude"].to_numpy(np.float32)[idx[2]],
        "longitude": stations["longitude"].to_numpy(np.float32)[idx[2]],
        "variable": np.asarray(variables)[idx[3]], "value": values.reshape(-1).astype(np.float32)})
    with atomic_path(path) as tmp:
        df.to_parquet(tmp, index=False)
    return path


def forecast_e2e(cfg: ForecastE2EConfig, ctx: JobContext) -> dict[str, Any]:
    stages = local_stages(cfg.stages, cfg.tracking.uri or resolve_uri())  # a folder, or a registered stages model
    tcfg, data, encoder, processor, decoder, used = load_chain(stages, cfg.store, cfg.obs_dir, cfg.deny)
    ctx.record_resolved(inputs_used(cfg, data))
    device = resolve_device(cfg.device)
    ds = open_store(data.spec.store)
    anchors = choose_inits(ds, data.spec, data.windows.anchors["test"], cfg.inits, cfg.steps, data.spec.store)
    init_times = ds[TIME].values[anchors]
    m, n = cfg.members.M, cfg.members.N
    if m * n > 1:  # before the job starts: stages without the stochastic finetunes are bad input
        senc, sproc, p, found = load_stochastic(stages, tcfg, data, m, n, cfg.dropout)
        used = {**used, **found}
    tracker = ctx.tracker
    if decoder is None:
        say(f"no decoder stage under {cfg.stages}: gridded forecasts only")
    say(f"forecasting {len(anchors)} init(s), {cfg.steps} step(s) from the analysis"
        + (f", denying {', '.join(cfg.deny)}" if cfg.deny else ""))
    members, extra = None, {}
    if m * n > 1:
        say(f"nested ensemble: {m} encoder draw(s) x {n} dropout member(s) (p={p:g})")
        table = station_table(data) if decoder is not None else None
        models = UnitModels(data.spec, senc, sproc or processor, decoder,
                            StationSet.of(data, table) if table is not None else None).to(device).prepare(p)
        plan = Plan(m, n, 1, cfg.steps, cfg.seed, tuple(cfg.deny), p)
        with batch_invariant(device):  # an init's members: the same bits whatever batch they are in (CPU)
            fields, st = run_members(models, data, anchors, plan, cfg.batch_size, device)
        stations = None if st is None else (table, st)
        members = list(range(m * n))
        extra = {"members": {"M": m, "N": n}, "dropout": p, "seed": cfg.seed, "seeds": SEED_NOTE}
    else:
        with batch_invariant(device):
            fields, stations = run_forecast(data, encoder, processor, decoder, anchors, cfg.steps, cfg.deny,
                                            cfg.batch_size, device, init_times, cfg.seed)
    forecast = to_forecast_dataset(fields, data.spec, ds, anchors, members)
    step = forecast[LEAD].values[0]
    forecast = forecast.assign_coords({LEAD: forecast[LEAD].values - step})  # lead 0 is the analysis
    forecast.attrs.update(source="wxray end-to-end forecast", stages=str(cfg.stages), deny=",".join(cfg.deny),
                          **{f"checkpoint_{k}": v for k, v in used.items()})
    written = nested_members(forecast, m, n) if members else forecast
    path = write_forecast(written, Path(ctx.out_dir) / "forecast.zarr")
    result: dict[str, Any] = {"forecast": str(path), "store": data.spec.store, "inits": int(len(anchors)),
                              "steps": cfg.steps,
                              "deny": list(cfg.deny), "checkpoints": used, **extra}
    scored = rollout_anchors(ds, anchors, data.spec, cfg.steps)
    if len(scored):
        report = rollout_report(forecast.sel({INIT: ds[TIME].values[scored]}), ds, open_climatology(data.spec.store))
        log_report(report, tracker)
        result["rollout"] = {"scored_inits": int(len(scored)), **report}
    if stations is not None:
        table, values = stations
        lead_hours = [int(round(h)) for h in forecast[LEAD].values / np.timedelta64(1, "h")]
        st_path = write_stations(Path(ctx.out_dir) / "stations.parquet", table, values, init_times,
                                 lead_hours, data.station_variables)
        result["stations"] = str(st_path)
        result["station_scores"] = score_stations(st_path, forecast, data, tracker)
    return result


def score_stations(path: Path, forecast, data: E2EData, tracker) -> dict[str, Any]:
    return station_report(path, data.obs.obs_dir, data.station_stream, forecast=forecast, tracker=tracker)
