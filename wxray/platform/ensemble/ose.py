"""Observing-system experiments (`jobs/ose.py`): what each observation stream contributes to the spread.

    python jobs/ose.py stages=runs/train_e2e/e2e members.M=4 members.N=4 streams=[stations,ships]
    python jobs/ose.py stages=runs/train_e2e/e2e                      # streams=[] : every stream, one at a time

A baseline ensemble, then one rerun per stream with that stream's encoder embedding zeroed (`deny`), each
fanned out on Ray actors like `jobs/ensemble.py` and sharing every draw with the baseline (common random
numbers: the draws depend on (seed, init, i, j, k) only), so the differences are the stream's alone and
not sampling noise. Per stream and lead, for U in (U_enc, U_drop[, U_route]):

    change = mean over channels c of ( mean_t U_c^denied(t) / mean_t U_c^baseline(t) ) - 1

with U_c(t) the latitude-weighted domain mean at init t of the unclipped (unbiased) component; its
confidence interval the fixed-b interval of the scorecard, paired over inits (`verify.denial`; measured to
hold its level, BENCHMARKS.md section 3), or with `significance_method=paper` the paper's paired circular
block bootstrap.
A stream the encoder leans on raises U_enc when withheld (the analysis is less certain); U_drop, the
processor's own uncertainty, should move much less. With `members.R` > 1 the processor's random token
selection is a level of its own, so U_drop is the dropout share alone (as in the paper, whose processor
does not route) and U_route is reported beside it; with R = 1 the routing draw rides in U_drop. Streams
are ranked by their U_enc change at `rank_lead`. Outputs: `<out>/baseline`, `<out>/deny_<stream>` (each an
ensemble run's stores), ose.csv, plots/ose_ranking.png, plots/ose_leads.png, MLflow metrics `ose/<stream>/<u>` per lead.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np

from wxray.config import NonNegInt, PosInt, Probability
from wxray.config_renames import deprecated
from wxray.console import say
from wxray.errors import ConfigError, DataError
from wxray.forecast.chain import inputs_used
from wxray.io import atomic_path
from wxray.job import JobContext
from wxray.platform.ensemble.batch import EnsembleConfig, build_models, run_members
from wxray.platform.ensemble.report import load_split
from wxray.verify.denial import MIN_INITS, change_table, components, domain_series, plot_ose


@dataclass
class OSEConfig(EnsembleConfig):
    streams: list[str] = field(default_factory=list)  # the streams denied, one rerun each; [] = every stream
    deny: list[str] = field(default_factory=list)  # deprecated (one release): streams
    keep_members: bool = False  # the split needs only the streamed moments
    rank_lead: NonNegInt = 1  # lead step (0 = analysis) at which streams are ranked by their U_enc change
    # fixed-b: the scorecard's HAC interval (holds its level); paper: the paired block bootstrap of the paper
    significance_method: Literal["fixed-b", "paper"] = "fixed-b"
    n_resamples: PosInt = 2000  # bootstrap resamples (significance_method=paper only)
    confidence: Probability = 0.95  # of the intervals

    experiment = "wxray-ose"
    columns = ("ose/*",)

    def run_label(self, job: str) -> str:
        return f"ose-{self.members.M}x{self.members.N}"

    def validate(self) -> None:
        super().validate()
        if self.deny:
            deprecated("deny", "streams")
            self.streams, self.deny = list(self.streams or self.deny), []
        if len(set(self.streams)) != len(self.streams):
            raise ConfigError(f"streams={self.streams}: a stream is named twice")
        if not 0 <= self.rank_lead <= self.lead_steps:
            raise ConfigError(f"rank_lead={self.rank_lead}: must lie in [0, lead_steps={self.lead_steps}]")


def ose(cfg: OSEConfig, ctx: JobContext) -> dict[str, Any]:
    models, layout, anchors, data, used = build_models(replace(cfg, deny=[]))
    ctx.record_resolved(inputs_used(cfg, data))
    names = [s.name for s in data.obs.streams]
    unknown = [s for s in cfg.streams if s not in names]
    if unknown:
        raise ConfigError(f"streams names {', '.join(unknown)}: not a stream the encoder reads ({', '.join(names)})")
    streams = list(cfg.streams) or names
    need = MIN_INITS[cfg.significance_method]
    if len(anchors) < need:
        raise DataError(f"inits: {len(anchors)} init(s); the OSE intervals (significance_method="
                        f"{cfg.significance_method}) need at least {need}")
    runs = {"baseline": (), **{s: (s,) for s in streams}}
    layouts = [replace(layout, plan=replace(layout.plan, deny=deny), attrs={**layout.attrs, "deny": ",".join(deny)})
               for deny in runs.values()]
    dirs = {name: "baseline" if not deny else f"deny_{name}" for name, deny in runs.items()}
    say(f"OSE: a baseline and {len(streams)} denial run(s) ({', '.join(streams)}), their units in one fan-out")
    paths = run_members(cfg, ctx, models, layouts, anchors, data, sub_dirs=list(dirs.values()))
    series = {name: domain_series(load_split(lay, p)[1], lay.plan.members_r)
              for name, p, lay in zip(runs, paths, layouts, strict=True)}
    hours = [float(k * layout.step / np.timedelta64(1, "h")) for k in range(cfg.lead_steps + 1)]
    table = change_table(series, streams, hours, cfg.members.R, method=cfg.significance_method,
                         confidence=cfg.confidence, n_resamples=cfg.n_resamples, seed=cfg.seed)
    with atomic_path(ctx.out_dir / "ose.csv") as tmp:
        table.to_csv(tmp, index=False)
    rank_hours = hours[cfg.rank_lead]
    at = table[(table.lead_hours == rank_hours) & (table.component == "u_enc")].set_index("stream")["change"]
    ranking = list(at.sort_values(ascending=False).index)
    tracker = ctx.tracker
    for row in table.itertuples():
        if np.isfinite(row.change):
            tracker.log_metrics({f"ose/{row.stream}/{row.component}": float(row.change)},
                                step=int(round(row.lead_hours)))  # the lead in hours, as in every job
    tracker.log_artifact(ctx.out_dir / "ose.csv")
    if cfg.plots:
        for path in plot_ose(table, ranking, rank_hours, ctx.out_dir / "plots"):
            tracker.log_artifact(path, "plots")
    base = series["baseline"]
    with np.errstate(divide="ignore", invalid="ignore"):  # a channel without spread: 0/0
        rho = {f"baseline_rho_{c[2:]}": [round(float(v), 4) for v in np.nanmean(
            [base[c][ch].mean(-1) / base["u_total"][ch].mean(-1) for ch in base[c]], axis=0)]
            for c in components(cfg.members.R)[1:]}
    at_rank = table[table.lead_hours == rank_hours].set_index(["stream", "component"])
    changes = {s: {c: [round(float(at_rank.loc[(s, c), k]), 4) for k in ("change", "lower", "upper")]
                   for c in components(cfg.members.R)} for s in streams}
    say(f"streams by U_enc change at +{rank_hours:g} h: "
        + ", ".join(f"{s} {changes[s]['u_enc'][0]:+.0%}" for s in ranking))
    return {"ranking": ranking, "rank_lead_hours": rank_hours, "changes": changes, **rho, "lead_hours": hours,
            "runs": {k: str(ctx.out_dir / v) for k, v in dirs.items()}, "table": str(ctx.out_dir / "ose.csv"),
            "inits": int(len(anchors)), "members": {"M": cfg.members.M, "N": cfg.members.N, "R": cfg.members.R},
            "checkpoints": used}
