"""The batch ensemble job (`jobs/ensemble.py`): nested M x N (x R) ensembles of the uplifted end-to-end chain
on Ray actors, and where their spread comes from.

    python jobs/ensemble.py stages=runs/train_e2e/e2e members.M=7 members.N=7 lead_steps=10
    python jobs/ensemble.py ... members.R=3             # + routing draws: U_route beside U_enc and U_drop
    python jobs/ensemble.py ... keep_members=false      # only streamed moments: disk does not grow with M N R

`stages` is the stages directory of `jobs/train_e2e.py` after `jobs/finetune_stochastic.py` (the
stochastic encoder, and the MC-dropout processor or `dropout=`). A work unit is (init t, encoder draw i):
an actor encodes once and rolls the N x R members out as one batch (`forecast/nested.py`, `actors.py`).
Outputs in the run directory (`store.py`): forecast.zarr (+ stations.zarr) or moments.zarr, then

    variance_maps.zarr   per variable (component, lead_time, ..., latitude, longitude): U_enc, U_drop, [U_route,]
                         U_total, rho_drop, init means (`verify.variance`)
    plots/               maps of each component at lead 0 and three later leads; curves vs lead
    scores.json          per lead: ensemble-mean RMSE, fair CRPS (members kept), spread-skill total and per branch

An interrupted run continues where it stopped when re-run with the same `out_dir`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import numpy as np

from wxray.config import InPath, PosFloat, PosInt, Range, RunsDir, Seed
from wxray.console import say
from wxray.data.anchors import choose_inits, parse_range, rollout_anchors
from wxray.data.e2e_windows import E2EReader
from wxray.data.schema import TIME, open_store, time_step
from wxray.errors import ConfigError
from wxray.forecast.chain import inputs_used, load_chain, load_stochastic, station_table
from wxray.forecast.mlflow_model import local_stages
from wxray.forecast.nested import Members, Plan, UnitModels
from wxray.forecast.rollout import routing_varies
from wxray.forecast.stages import StationSet
from wxray.forecast.workers import WorkersConfig
from wxray.job import JobConfig, JobContext
from wxray.platform.cluster.replicas import check_fits, largest_node_memory
from wxray.platform.cluster.session import ensure_ray
from wxray.platform.ensemble.actors import fan_out
from wxray.platform.ensemble.report import analyse, summary_line
from wxray.platform.ensemble.store import EnsembleStore, Layout
from wxray.sizes import check_disk, check_memory
from wxray.tracking import resolve_uri
from wxray.verify.lead_scores import truth_like


@dataclass
class MembersConfig(Members):
    M: PosInt = 4  # encoder noise draws (needs the stochastic encoder); >= 2 for the split
    N: PosInt = 4  # MC-dropout members per encoder draw; >= 2 for the split
    R: PosInt = 1  # routing draws per dropout member (a processor with random routing); 1 = none

    def validate(self) -> None:
        for key in ("M", "N"):
            if getattr(self, key) < 2:
                raise ConfigError(f"members.{key}={getattr(self, key)}: the variance split needs at least 2 "
                                  "(jobs/forecast_e2e.py makes plain ensembles)")


@dataclass
class EnsembleConfig(JobConfig):
    stages: RunsDir = "runs/train_e2e/e2e"  # stages folder of train_e2e + finetune_stochastic (or a URL, models:/...)
    store: InPath = ""  # "" = the store the stages were trained on
    obs_dir: InPath = ""  # "" = the observation streams the stages were trained on
    inits: str = ""  # "start/end" init times, inclusive; "" = the test split with truth at every lead
    lead_steps: PosInt = 4  # processor steps after the analysis (lead 0)
    members: MembersConfig = field(default_factory=MembersConfig)
    deny: list[str] = field(default_factory=list)  # streams withheld from the encoder (observing-system denial)
    dropout: Annotated[float, Range(-1, 1, hi_open=True)] = -1.0  # inference dropout p; -1 = as finetuned
    seed: Seed = 0  # every draw from SeedSequence([seed, t, source, i(, j(, k))]) (forecast/seeds.py)
    keep_members: bool = True  # false: only the streamed moments (moments.zarr), no forecast.zarr
    workers: WorkersConfig = field(default_factory=WorkersConfig)
    ray_address: str = ""  # "" = RAY_ADDRESS under ray job submit, else a local cluster
    ray_timeout_s: PosFloat = 60.0  # give up on an unreachable ray_address after this many seconds
    plots: bool = True  # variance maps and curves (PNG) in plots/ and MLflow

    experiment = "wxray-ensemble"
    renamed = {"checkpoint": "stages"}  # one release
    columns = ("ensemble/ssr_total/*", "ensemble/rho_drop/*")  # at the last lead (the step)

    def run_label(self, job: str) -> str:
        m = self.members
        r = f"x{m.R}" if m.R > 1 else ""
        return f"ensemble-{m.M}x{m.N}{r}" + ("-deny-" + "-".join(self.deny) if self.deny else "")

    def validate(self) -> None:
        if self.inits:
            parse_range(self.inits, "inits")


def build_models(cfg: EnsembleConfig) -> tuple[UnitModels, Layout, np.ndarray, Any, dict[str, str]]:
    """The replica every actor holds, the output layout, the init indices, the data and the checkpoints."""
    stages = local_stages(cfg.stages, cfg.tracking.uri or resolve_uri())  # a folder, or a registered stages model
    tcfg, data, _, processor, decoder, used = load_chain(stages, cfg.store, cfg.obs_dir, cfg.deny)
    m = cfg.members
    senc, sproc, p, found = load_stochastic(stages, tcfg, data, m.M, m.N, cfg.dropout,
                                            keys=("members.M", "members.N"))
    processor = sproc or processor
    if m.R > 1 and not routing_varies(processor):
        raise ConfigError(f"members.R={m.R}: the processor's token selection does not vary with its draws "
                          "(dense, fixed or score-based routing); R > 1 needs random routing")
    anchors = choose_inits(open_store(data.spec.store), data.spec, data.windows.anchors["test"], cfg.inits,
                           cfg.lead_steps, data.spec.store)
    stations = station_table(data) if decoder is not None else None
    models = UnitModels(data.spec, senc, processor, decoder,
                        StationSet.of(data, stations) if stations is not None else None)
    plan = Plan(m.M, m.N, m.R, cfg.lead_steps, cfg.seed, tuple(cfg.deny), p, cfg.keep_members)
    ds = open_store(data.spec.store)
    step = time_step(ds) * data.spec.lead_steps
    used = {**used, **found}
    layout = Layout(plan, data.spec, ds[TIME].values[anchors], step,
                    attrs={"source": "wxray batch ensemble", "stages": str(cfg.stages),
                           "deny": ",".join(cfg.deny), "dropout": p, "seed": cfg.seed,
                           "seeds": "SeedSequence([seed, t, 1, i]) noise, [.., 2, i, j] masks, [.., 3, i, j, k] routes",
                           **{f"checkpoint_{k}": v for k, v in used.items()}},
                    stations=stations, station_variables=list(data.station_variables),
                    units={v: str(ds[v].attrs.get("units", "")) for v in ds.data_vars})
    return models, layout, anchors, data, used


def check_sizes(layouts: Sequence[Layout], n_init: int, out_dir: Path) -> None:
    """Refuse, from the shapes, a unit no node's memory holds (its N x R members' fields and states at once)
    and members that do not fit on the disk of `out_dir` (compressed at best 2:1)."""
    plan, spec = layouts[0].plan, layouts[0].spec
    member = (plan.lead_steps + 1) * len(spec.inputs) * int(np.prod(spec.kept_grid)) * 4
    unit = plan.members_n * plan.members_r * member
    check_memory(2 * unit, f"one unit (members.N={plan.members_n} x members.R={plan.members_r} members of "
                 f"{plan.lead_steps + 1} steps)", "members.N (or members.R, lead_steps)", have=largest_node_memory())
    if plan.keep_members:
        check_disk(len(layouts) * n_init * plan.members_m * unit / 2, out_dir,
                   f"{len(layouts)} run(s) of {n_init} init(s) x {plan.members_m * plan.members_n * plan.members_r} "
                   "members", "the members, inits or lead_steps (or set keep_members=false)")


def run_members(cfg: EnsembleConfig, ctx: JobContext, models: UnitModels, layouts: Sequence[Layout],
                anchors: np.ndarray, data, sub_dirs: Sequence[str] = ("",)) -> list[dict[str, Path]]:
    """Fan the units of one or more runs (`layouts` differing only in the streams they deny, each written to
    its `sub_dirs` entry) out together, skipping those an interrupted run wrote, and finish their stores."""
    from tqdm import tqdm

    w = cfg.workers
    ensure_ray(cfg.ray_address, timeout_s=cfg.ray_timeout_s)
    members_m = layouts[0].plan.members_m
    check_fits(min(w.actors, len(anchors) * members_m), w.num_cpus, w.num_gpus, w.vendor)  # no output yet
    check_sizes(layouts, len(anchors), Path(cfg.out_dir))
    stores, done = [], []
    for sub_dir, layout in zip(sub_dirs, layouts, strict=True):
        out = ctx.out_dir / sub_dir
        out.mkdir(parents=True, exist_ok=True)
        stores.append(EnsembleStore(out, layout))
        done.append(stores[-1].open())
        if stores[-1].complete:
            say(f"{out}: this run's stores are complete already, reusing them")
    ctx.keep_on_failure = True  # written units survive a failure: a re-run continues from them
    # init by init, so each init's inputs are read once for all the runs and freed after its last unit
    units = [(r, a, i) for a in range(len(anchors)) for r, store in enumerate(stores) if not store.complete
             for i in range(members_m) if (a, i) not in done[r]]
    total = sum(len(anchors) * members_m for store in stores if not store.complete)
    if units:
        plan = layouts[0].plan
        say(f"{total} unit(s) (init x encoder draw{' x run' if len(stores) > 1 else ''}) of "
            f"{plan.members_n * plan.members_r} member(s) each"
            + (f"; {total - len(units)} already written, continuing" if total > len(units) else "")
            + f"; {min(w.actors, len(units))} actor(s)")
        reader = E2EReader(data.spec, data.obs)
        with tqdm(total=total, initial=total - len(units), desc="ensemble units", unit="unit") as bar:
            fan_out(models, [lay.plan for lay in layouts], units, layouts[0].init_times,
                    lambda a: reader.inputs(anchors[[a]]), lambda r, a, i, unit: stores[r].write(a, i, unit),
                    workers=w, progress=bar.update)
    return [store.finish() for store in stores]


def ensemble(cfg: EnsembleConfig, ctx: JobContext) -> dict[str, Any]:
    models, layout, anchors, data, used = build_models(cfg)
    ctx.record_resolved(inputs_used(cfg, data))
    plan = layout.plan
    say(f"nested ensemble: {plan.members_m} encoder draw(s) x {plan.members_n} dropout member(s) "
        f"(p={plan.dropout:g})"
        + (f" x {plan.members_r} routing draw(s)" if plan.members_r > 1 else "")
        + f", {len(anchors)} init(s), {plan.lead_steps} step(s)"
        + (f", denying {', '.join(cfg.deny)}" if cfg.deny else ""))
    [paths] = run_members(cfg, ctx, models, [layout], anchors, data)
    ds = open_store(data.spec.store)
    scored = ds[TIME].values[rollout_anchors(ds, anchors, data.spec, cfg.lead_steps)]
    report = analyse(layout, paths, lambda like: truth_like(ds, like), scored, ctx.out_dir, ctx.tracker, cfg.plots)
    say(summary_line(report))
    keys = ("lead_hours", "scored_inits", "rho_drop", "ssr_total", "ssr_enc", "ssr_drop", "ssr_route", "rmse", "crps")
    return {"stores": {k: str(v) for k, v in paths.items()}, "store": data.spec.store, "inits": int(len(anchors)),
            "members": {"M": plan.members_m, "N": plan.members_n, "R": plan.members_r}, "dropout": plan.dropout,
            "deny": list(cfg.deny), "seed": cfg.seed, "checkpoints": used,
            "scores": str(ctx.out_dir / "scores.json"), **{k: report[k] for k in keys if k in report},
            **({"station_rho_drop": report["stations"]["rho_drop"]} if "stations" in report else {})}
