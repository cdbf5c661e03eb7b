"""Job plumbing shared by every `jobs/*.py`: config, run directory, MLflow, summary, RESULT line.

A job is `main(cfg, ctx) -> dict` of key figures. `run_job` loads and validates the config before any
work starts, creates `out_dir`, saves the resolved config, runs `main` inside an MLflow run, writes
`summary.json` atomically and prints `RESULT {json}`. A `WxrayError` (bad input) becomes one line on
stderr and exit status 2; the run directory is removed unless the job asked to keep it (checkpoints).
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from wxray.config import dump_yaml, flatten, load_config, to_dict
from wxray.errors import WxrayError
from wxray.io import write_json, write_text
from wxray.tracking import Tracker, TrackingConfig

C = TypeVar("C", bound="JobConfig")


@dataclass
class JobConfig:
    """The keys every job has; each job's config dataclass inherits them."""

    out_dir: str = ""  # "" = runs/<job>/<UTC timestamp>
    run_name: str = ""  # MLflow run name ("" = <job>-<out_dir name>)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)


@dataclass
class JobContext:
    job: str
    out_dir: Path
    tracker: Tracker
    keep_on_failure: bool = False


def default_out_dir(job: str) -> Path:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    return Path("runs") / job / stamp


def _fail(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return 2


def run_job(job: str, cfg_cls: type[C], main: Callable[[C, JobContext], dict[str, Any]],
            argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        cfg = load_config(cfg_cls, argv)
    except WxrayError as e:
        return _fail(str(e))

    out_dir = Path(cfg.out_dir or default_out_dir(job))
    created = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    write_text(out_dir / "config.yaml", dump_yaml(cfg))
    run_name = cfg.run_name or f"{job}-{out_dir.name}"
    tracker = None
    ctx = None
    try:
        # Re-running into the same out_dir (e.g. a resumed training run) continues its MLflow run.
        id_file = out_dir / ".mlflow_run_id"
        previous = id_file.read_text().strip() if id_file.exists() else None
        tracker = Tracker(cfg.tracking, run_name=run_name, tags={"wxray.job": job}, run_id=previous)
        if tracker.run_id:
            write_text(id_file, tracker.run_id)
        ctx = JobContext(job=job, out_dir=out_dir, tracker=tracker)
        tracker.log_params(flatten(to_dict(cfg)))
        result = main(cfg, ctx)
        result = {**result, "out_dir": str(out_dir)}
        if tracker.run_id:
            result.setdefault("mlflow_run_id", tracker.run_id)
        write_json(out_dir / "summary.json", result)
        tracker.log_artifact(out_dir / "summary.json")
        tracker.log_artifact(out_dir / "config.yaml")
        tracker.end("FINISHED")
    except WxrayError as e:
        if tracker is not None:
            tracker.set_tags({"wxray.error": str(e)[:5000]})
            tracker.end("FAILED")
        if created and not (ctx and ctx.keep_on_failure):
            shutil.rmtree(out_dir, ignore_errors=True)
        return _fail(str(e))
    except KeyboardInterrupt:
        if tracker is not None:
            tracker.end("KILLED")
        return _fail("interrupted")
    except BaseException:
        # A bug, not bad input: keep the traceback, but do not leave the MLflow run "RUNNING".
        if tracker is not None:
            tracker.end("FAILED")
        raise
    print("RESULT " + json.dumps(result, sort_keys=True, default=str), flush=True)
    return 0
