"""`jobs/sweep.py`: Ray Tune over the training job, each trial a full `jobs/train_sparse.py` run.

    python jobs/sweep.py --config configs/sweeps/keep_ratio.yaml
    python jobs/sweep.py --config configs/sweeps/keep_ratio.yaml out_dir=runs/sweep/kr   # again: restores

Train+Tune pattern (Ray 2.60, Train V2): `trial_fn(config)` is the Tune trainable; it builds and fits the
trial's `TorchTrainer` through `sparse.train_sparse` with a `TuneReportCallback`, so every epoch report of
Train rank 0 is one Tune result (ASHA's time attribute is the reported `epoch`). A trial's run directory is
`<out_dir>/trials/<trial id>` (Tune keeps trial ids across a restore, and Train resumes from the checkpoints
under that directory). MLflow: the sweep is the parent run; each trial a child run (tag mlflow.parentRunId)
created once, its id kept in the trial directory, so a restored sweep continues the same child runs.

Resources: a trial is one Tune actor (`TRIAL_CPUS`, it only drives) plus its Train workers and data reads,
which Tune does not see; `max_concurrent_trials` is derived from the cluster and those per-trial needs.
A sqlite tracking store takes one writer at a time: with it trials run one after another (say so), an MLflow
server (tracking.uri=http://...) lets them run side by side. ASHA's rungs are part of a restore (Tune's own
restore keeps no scheduler state): the restored sweep judges the remaining trials against every result
reported before the interruption too. ASHA's stop reaches a trial as a request it obeys after that epoch
(tune/stopping.py), never as a killed actor.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from mlflow.tracking import MlflowClient
from ray import tune
from ray.tune import Callback
from ray.tune.schedulers import FIFOScheduler

from wxray.config import from_dict, resolve_paths, to_dict
from wxray.console import say, verbose
from wxray.errors import ConfigError
from wxray.io import resolve_path
from wxray.job import JobContext
from wxray.platform.cluster import session
from wxray.tune import results
from wxray.tune.calibration import forecast_trial_fn
from wxray.tune.checks import check_metric, concurrency, trial_resources
from wxray.tune.config import SweepConfig
from wxray.tune.space import Axis, n_trials, param_space, parse_space, trial_config
from wxray.tune.stopping import RUNGS, cooperative_asha
from wxray.tune.trials import ID_FILE, label, trial_fn

__all__ = ["SweepConfig", "sweep"]


def progress_callback(total: int, max_epochs: int, metric: str):
    """A Tune callback printing one line per finished or stopped trial (Tune's own tables stay off)."""
    class Printer(Callback):
        def __init__(self):
            self.done = 0

        def on_trial_complete(self, iteration, trials, trial, **info):
            self.done += 1
            last = trial.last_result or {}
            figure = ", ".join(f"{k} {last[k]:.4g}" for k in dict.fromkeys((metric, "val/loss")) if k in last)
            epochs = int(last.get("epoch", 0))
            early = " (stopped early)" if epochs < max_epochs else ""
            say(f"trial {self.done}/{total} {trial.trial_id} ({label(trial.config['params'])}): "
                f"{epochs} epoch(s){early}{', ' + figure if figure else ''}")

        def on_trial_error(self, iteration, trials, trial, **info):
            self.done += 1
            say(f"trial {self.done}/{total} {trial.trial_id} ({label(trial.config['params'])}) failed; "
                f"see {trial.local_path}")

    return Printer()


def run_sweep(cfg: SweepConfig, ctx: JobContext, axes: list[Axis], trial_cfgs: list, n_concurrent: int,
              base: dict[str, Any]):
    """Tuner.fit (or Tuner.restore(...).fit() when the sweep directory holds an unfinished sweep)."""
    sweep_dir = Path(ctx.out_dir).resolve()
    tune_dir = sweep_dir / "tune"
    fn = forecast_trial_fn if cfg.job == "forecast_e2e" else trial_fn
    trainable = tune.with_resources(fn, trial_resources(trial_cfgs[0]))
    epochs = max_epochs(trial_cfgs)
    restoring = tune.Tuner.can_restore(str(tune_dir))
    if not restoring:  # rungs of an earlier sweep in this folder are not this one's
        (sweep_dir / RUNGS).unlink(missing_ok=True)
    scheduler = (cooperative_asha(sweep_dir, time_attr="epoch", max_t=epochs,
                                  grace_period=min(cfg.grace_period, epochs), reduction_factor=cfg.reduction_factor)
                 if cfg.scheduler == "asha" else FIFOScheduler())
    total = n_trials(axes, cfg.num_samples)
    run_config = tune.RunConfig(name="tune", storage_path=str(sweep_dir), verbose=0,
                                callbacks=[progress_callback(total, epochs, cfg.metric)],
                                failure_config=tune.FailureConfig(max_failures=0))
    if restoring:
        say(f"restoring the sweep in {tune_dir}: finished trials are kept, the others run or resume")
        tuner = tune.Tuner.restore(str(tune_dir), trainable=trainable, resume_unfinished=True,
                                   resume_errored=True, param_space=_space(cfg, axes, ctx, base))
    else:
        tuner = tune.Tuner(
            trainable, param_space=_space(cfg, axes, ctx, base), run_config=run_config,
            # Tune checks its metric in every result; fifo needs none (and the best trial is chosen here,
            # results.best_row), so a metric reported at the last epoch only (an EDM's RMSE) can be swept on.
            tune_config=tune.TuneConfig(metric=cfg.metric if cfg.scheduler == "asha" else None,
                                        mode=cfg.mode if cfg.scheduler == "asha" else None, scheduler=scheduler,
                                        num_samples=cfg.num_samples, max_concurrent_trials=n_concurrent))
    if not verbose():
        # Tune's new console output prints its tables whatever `verbose` says; the legacy engine at
        # verbose=0 prints nothing, and the sweep's own lines (_Progress) say what a user needs.
        os.environ["RAY_AIR_NEW_OUTPUT"] = "0"
    return tuner.fit()


def max_epochs(trial_cfgs: list) -> int:
    """The epochs of the longest trial (0 for inference trials)."""
    return max(tc.train.epochs if hasattr(tc, "train") else 0 for tc in trial_cfgs)


def _space(cfg: SweepConfig, axes: list[Axis], ctx: JobContext, base: dict[str, Any]) -> dict[str, Any]:
    tracking = to_dict(cfg.tracking)
    return {**param_space(axes), "base": base, "cooperative": cfg.scheduler == "asha",
            "sweep_dir": str(Path(ctx.out_dir).resolve()), "tracking": tracking,
            "parent_run_id": ctx.tracker.run_id or ""}


def _mark_stopped(table, tracking: dict[str, Any]) -> None:
    """Tag the child runs of early-stopped trials (wxray.stopped=asha); a failed trial's run that was left
    RUNNING (its actor died) ends FAILED."""
    if not tracking.get("enabled", True) or not len(table):
        return
    client = MlflowClient(tracking_uri=tracking["uri"])
    for _, row in table[table["stopped_early"] | table["failed"]].iterrows():
        id_file = Path(row["trial_dir"]) / ID_FILE
        if not id_file.exists():
            continue
        run_id = id_file.read_text().strip()
        if row["stopped_early"]:
            client.set_tag(run_id, "wxray.stopped", "asha")
        elif client.get_run(run_id).info.status == "RUNNING":
            client.set_terminated(run_id, "FAILED")


def sweep(cfg: SweepConfig, ctx: JobContext) -> dict[str, Any]:
    cls = cfg.job_config_class()
    try:
        base_cfg = from_dict(cls, cfg.base_dict())
    except ConfigError as e:
        raise ConfigError(f"the trials' base config (job={cfg.job}, base={cfg.base or '-'} + overrides): {e}") \
            from None
    resolve_paths(base_cfg, resolve_path)  # trials run in Tune's trial directories: no relative paths
    base = to_dict(base_cfg)
    axes = parse_space(cfg.space, base, cfg.repeat, cls)
    trial_cfgs = [base_cfg] + [trial_config(base, {a.key: v}, cls) for a in axes for v in a.values]
    check_metric(cfg, trial_cfgs)
    session.ensure_ray(cfg.ray_address, timeout_s=cfg.ray_timeout_s)
    n_concurrent = concurrency(cfg, trial_cfgs, cfg.tracking.uri if cfg.tracking.enabled else "")
    total = n_trials(axes, cfg.num_samples)
    ctx.start()
    ctx.keep_on_failure = True  # finished trials are what a re-run restores from
    say(f"sweep of {total} trial(s) over {', '.join(a.key for a in axes)}, {n_concurrent} at a time, "
        f"{cfg.scheduler} on {cfg.metric} ({cfg.mode}); run directory {ctx.out_dir}")
    grid = run_sweep(cfg, ctx, axes, trial_cfgs, n_concurrent, base)

    out = Path(ctx.out_dir)
    table = results.collect(grid, axes, cfg.metric, max_epochs(trial_cfgs))
    _mark_stopped(table, to_dict(cfg.tracking))
    summary = results.summarise(table, axes, cfg.metric)
    files = [results.write_csv(out / "results.csv", table)]
    if len(summary):
        files.append(results.write_csv(out / "summary.csv", summary))
    png = results.plot(out / "sweep.png", table, summary, axes, cfg.metric, cfg.mode)
    best = results.best_row(table, cfg.metric, cfg.mode)
    if best is not None:
        files.append(results.write_best_config(out / "best_config.yaml", best, axes, base, cfg.metric, cls))
    for f in files + ([png] if png else []):
        ctx.tracker.log_artifact(f)
    if best is not None:
        ctx.tracker.log_metrics({f"best/{cfg.metric}": float(best[cfg.metric])})
    counts = {k: int(table[k].sum()) if len(table) else 0 for k in ("finished", "stopped_early", "failed")}
    return {"trials": int(len(table)), **counts, "metric": cfg.metric,
            "best": None if best is None else {"trial_id": best["trial_id"], cfg.metric: float(best[cfg.metric]),
                                               **{a.key: results.plain_value(best[a.key]) for a in axes}},
            "best_config": str(out / "best_config.yaml") if best is not None else None,
            "results": str(out / "results.csv"), "plot": str(png) if png else None}
