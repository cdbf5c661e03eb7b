"""A Tune trial as a run of a job: its config, run directory and MLflow child run (`run_trial`), and the training
trial (`trial_fn`: `jobs/train_sparse.py` with this trial's values, reporting every epoch to Tune).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from mlflow.tracking import MlflowClient
from ray import tune
from ray.train import UserCallback
from ray.tune.integration.ray_train import TuneReportCallback

from wxray.io import write_json
from wxray.job import JobContext
from wxray.platform.train.config import TrainSparseConfig
from wxray.platform.train.sparse import train_sparse
from wxray.tune.space import trial_config
from wxray.tune.stopping import decisions_dir

ID_FILE = ".mlflow_run_id"
LAST_REPORT = "last_report.json"


def label(params: dict[str, Any]) -> str:
    return ", ".join(f"{k.split('.')[-1]}={v}" for k, v in params.items())


def child_run(tracking: dict[str, Any], parent_id: str, trial_dir: Path, name: str) -> str | None:
    """The MLflow run of a trial under the sweep's parent run: created once, its id kept in the trial directory."""
    id_file = trial_dir / ID_FILE
    if id_file.exists():
        return id_file.read_text().strip()
    if not tracking.get("enabled", True) or not parent_id:
        return None
    client = MlflowClient(tracking_uri=tracking["uri"])
    parent = client.get_run(parent_id)
    run = client.create_run(parent.info.experiment_id, run_name=name,
                            tags={"mlflow.parentRunId": parent_id, "wxray.job": "train_sparse"})
    trial_dir.mkdir(parents=True, exist_ok=True)
    id_file.write_text(run.info.run_id)
    return run.info.run_id


def trial_dir_of(config: dict[str, Any]) -> tuple[str, Path]:
    """(trial id, run directory <sweep dir>/trials/<trial id>) of the running Tune trial."""
    trial_id = tune.get_context().get_trial_id()
    return trial_id, Path(config["sweep_dir"]) / "trials" / trial_id


def run_trial(config: dict[str, Any], cls: type, job: str, work) -> dict[str, Any]:
    """A trial as a run of `job`: its config (`cls`) is the base with this trial's values, its run directory
    `trial_dir_of`, its MLflow run a child of the sweep's. `work(cfg, ctx)` does the job's work and returns
    its result, written as the trial's summary.json; a failure ends the child run FAILED."""
    trial_id, trial_dir = trial_dir_of(config)
    cfg = trial_config(config["base"], config["params"], cls)
    cfg.out_dir, cfg.run_name = str(trial_dir), f"{trial_id}: {label(config['params'])}"
    for k, v in config["tracking"].items():
        setattr(cfg.tracking, k, v)
    child_run(config["tracking"], config["parent_run_id"], trial_dir, cfg.run_name)
    ctx = JobContext(job, cfg, trial_dir, lock=False)
    try:
        result = work(cfg, ctx)
    except BaseException:
        if ctx.started:
            ctx.tracker.end("FAILED")
        raise
    finally:
        ctx.release()
    write_json(trial_dir / "summary.json", {**result, "out_dir": str(trial_dir), "trial_id": trial_id})
    ctx.tracker.log_artifact(trial_dir / "summary.json")
    ctx.tracker.end("FINISHED")
    return result


def trial_fn(config: dict[str, Any]) -> None:
    """One trial: the training job with this trial's values (run_trial)."""
    trial_id, trial_dir = trial_dir_of(config)
    last = trial_dir / LAST_REPORT
    if (trial_dir / "summary.json").exists() and last.exists():
        # Finished before the sweep was interrupted, after Tune's last snapshot: report the result again
        # rather than train or evaluate again.
        tune.report(json.loads(last.read_text()))
        return
    decisions = decisions_dir(config["sweep_dir"], trial_id)
    shutil.rmtree(decisions, ignore_errors=True)  # a restored trial replays its epochs: decide them afresh

    def work(cfg, ctx):
        cfg.train.checkpoint_every = 1  # a trial told to stop ends on the checkpoint of that epoch
        cfg.register_model = False  # every trial's model is logged to its run; the registry is not a sweep's log
        return train_sparse(cfg, ctx, callbacks=[TuneReportCallback(), _last_report(last)],
                            decisions=str(decisions) if config["cooperative"] else "")

    run_trial(config, TrainSparseConfig, "train_sparse", work)


def _last_report(path: Path):
    """A Ray Train callback keeping the newest report's metrics in `path` (what a re-run trial reports again)."""
    class LastReport(UserCallback):
        def after_report(self, run_context, metrics, checkpoint):
            write_json(path, {k: v for k, v in metrics[0].items() if isinstance(v, (int, float, str))})

    return LastReport()
