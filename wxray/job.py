"""Job plumbing shared by every job (`jobs/*.py`, the `wxray` command): config, run directory, MLflow,
summary, RESULT line.

A job is `main(cfg, ctx) -> dict` of key figures. `run_job`:

1. answers `--help` (every key with its type, default and doc) and takes `--verbose` (Ray's own output);
2. loads and validates the config, makes every path key absolute against the wxray home
   (`wxray.io.home()`: $WXRAY_HOME, else the working directory) and checks that every output location
   can be written -- all before any work starts;
3. runs `main`. Nothing is written and no MLflow run exists until the job *starts*: when `main` calls
   `ctx.start()` after checking its inputs, first touches `ctx.tracker`, or returns. Starting creates
   the run directory, writes the resolved `config.yaml` and opens (or, for a re-run into the same
   directory, continues) the MLflow run;
4. writes `summary.json` atomically and prints `RESULT {json}` with absolute paths.

Provenance (`wxray.provenance`): starting records the git commit (and dirty flag), versions, CUDA/ROCm, host,
Ray node types and the config's seeds, plus what the job added to `ctx.provenance` (the store it read:
`store_fingerprint`), as MLflow tags `wxray.*`, `provenance.json` in the run directory and the
`provenance` block of summary.json (RESULT leaves it out). A tracking server that does not answer is a
one-line error before any work, or with `tracking.required=false` a warning and the local store
(RESULT's `tracking_fallback`). Credential-looking values are redacted in config.yaml and MLflow params.

Bad input (`WxrayError`) is one line on stderr and exit status 2. Before the job starts nothing has been
written. After, a failure removes the run directory (and any parent folders) this job created; in an
existing run directory it removes the entries the job added and restores the files written through
`ctx.write_text` (config.yaml, .mlflow_run_id) -- jobs check their inputs before starting, so they do not
fail after replacing an earlier output. `ctx.keep_on_failure` (set once checkpoints are being written)
keeps everything. Ctrl-C is the line `error: interrupted`, exit status 130, the MLflow run KILLED and the
same rollback.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import json
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from wxray import provenance
from wxray.config import MODEL_URIS, OutDir, dump_yaml, flatten, load_config, path_keys, resolve_paths, to_dict
from wxray.config_help import describe
from wxray.console import VERBOSE_ENV, say
from wxray.data import integrity, location
from wxray.errors import ConfigError, WxrayError
from wxray.io import (
    RUN_LOCK,
    Busy,
    check_apart,
    check_run_dir,
    check_run_name,
    check_writable,
    home,
    lock,
    relocated,
    resolve_path,
    under_job_submission,
    write_json,
    write_text,
)
from wxray.sizes import free_disk, human
from wxray.tracking import Tracker, TrackingConfig, check_server, redact, redact_uri, resolve_uri

C = TypeVar("C", bound="JobConfig")
INTERRUPTED = 130  # the exit status of a job stopped by Ctrl-C (SIGINT), as the shell reports one


@dataclass
class JobConfig:
    """The keys every job has; each job's config dataclass inherits them."""

    out_dir: OutDir = ""  # run directory; "" = runs/<job>/<UTC timestamp> under the wxray home
    run_name: str = ""  # MLflow run name; "" = <what the run is>-<out_dir name>
    out_dir_reuse: bool = False  # write into an out_dir that holds other files and is not a wxray run directory
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    anonymous: bool = False  # read s3:// and gs:// URLs without credentials (public buckets: WeatherBench 2, ARCO)

    experiment = "wxray"  # the job's MLflow experiment when tracking.experiment is "" (class attribute)
    columns: ClassVar[tuple[str, ...]] = ()  # metrics (fnmatch patterns) the MLflow UI's runs table shows
    # {old key: new key} of renamed keys: the old name works for one release with a deprecation line (config.py)
    renamed: ClassVar[dict[str, str]] = {}

    def run_label(self, job: str) -> str:
        """The distinguishing start of the default MLflow run name (jobs override: model, keep ratio)."""
        return job


def recorded_path(path: str, what: str) -> str:
    """A path a checkpoint or run recorded (absolute, from where it was made), as usable here: a URL or a path
    that exists as it is; else, for a project folder moved or copied whole, the same tail under the wxray home
    (`io.relocated`, with a line saying so); else the path itself (the caller's check names it)."""
    if not path or location.is_remote(path):
        return path
    recorded = resolve_path(path)
    moved = relocated(recorded)
    if moved is None:
        return str(recorded)
    say(f"{what} {recorded} is gone; using {moved}, the same path under the wxray home {home()}")
    return str(moved)


class JobContext:
    """What `main` gets besides its config: the run directory and the MLflow tracker.

    Touching either (`ctx.out_dir`, `ctx.tracker`) starts the job; peek at an existing run directory
    before that through `cfg.out_dir`.
    """

    def __init__(self, job: str, cfg: JobConfig, out_dir: Path, lock: bool = True):
        self.job, self.cfg, self._out_dir = job, cfg, out_dir
        self.locks_dir = lock  # False: a Tune trial, whose directory Tune already gives to one runner at a time
        self.keep_on_failure = False  # set once partial outputs are worth keeping (checkpoints)
        self._tracker: Tracker | None = None
        self._created: Path | None = None  # the topmost folder this job created (run directory or a parent)
        self._before: set[str] | None = None  # names in an existing run directory when the job started
        self._backups: dict[Path, bytes] = {}
        self._held = contextlib.ExitStack()
        # a second home of the run directory (a training run's folder under train.storage, maybe a URL): its
        # MLflow run id is taken from there when this directory has none, and the run's files go there at the end
        self.mirror = ""
        # what produced the run (wxray.provenance); a job adds the stores it read before starting
        self.provenance: dict[str, Any] = {}

    @property
    def started(self) -> bool:
        return self._tracker is not None

    @property
    def out_dir(self) -> Path:
        self.start()
        return self._out_dir

    @property
    def tracker(self) -> Tracker:
        self.start()
        return self._tracker

    def write_text(self, name: str, text: str) -> Path:
        """Write a file of the run directory; its previous content comes back if the job fails."""
        path = self._out_dir / name
        if path.is_file() and path not in self._backups:
            self._backups[path] = path.read_bytes()
        return write_text(path, text)

    def start(self) -> None:
        """The inputs are checked: create the run directory, write config.yaml, open the MLflow run."""
        if self._tracker is not None:
            return
        if not self._out_dir.exists():
            top = self._out_dir
            while not top.parent.exists():
                top = top.parent
            self._created = top
        self._out_dir.mkdir(parents=True, exist_ok=True)
        try:
            if self.locks_dir:
                self._held.enter_context(lock(self._out_dir / RUN_LOCK, wait=False))
        except Busy as e:
            self._created = None  # the other job's directory: not ours to remove
            raise ConfigError(f"config key 'out_dir': {self._out_dir} is in use by another wxray job ({e.holder}); "
                              "wait for it to finish or choose another out_dir") from None
        self._before = set() if self._created else {p.name for p in self._out_dir.iterdir()} | {RUN_LOCK}
        cfg = self.cfg
        cfg.run_name = cfg.run_name or f"{cfg.run_label(self.job)}-{self._out_dir.name}"
        config = to_dict(cfg)
        self.write_text("config.yaml", dump_yaml(redact("", config)))  # the resolved config (no credentials)
        id_file = self._out_dir / ".mlflow_run_id"
        previous = id_file.read_text().strip() if id_file.exists() else self._mirrored(id_file.name)
        self._tracker = Tracker(cfg.tracking, run_name=cfg.run_name, tags={"wxray.job": self.job},
                                run_id=previous, columns=type(cfg).columns)  # a re-run continues its run
        if self._tracker.run_id:
            self.write_text(".mlflow_run_id", self._tracker.run_id)
            if self.mirror:  # at once: a job killed later is still continued elsewhere as one MLflow run
                location.put(id_file, location.join(self.mirror, id_file.name))
        flat = flatten(config)
        changed = self._tracker.log_params(flat)
        if changed:
            say(f"continuing MLflow run {self._tracker.run_id} with changed keys: "
                + ", ".join(f"{k}={v}" for k, v in sorted(changed.items())))
        self.provenance = {**provenance.collect(seeds=provenance.seeds(flat)), **self.provenance}
        self.record_provenance()

    def _mirrored(self, name: str) -> str | None:
        """The text of file `name` in the mirror, if there is one."""
        remote = location.join(self.mirror, name) if self.mirror else ""
        return location.read_text(remote).strip() if remote and location.exists(remote) else None

    def record_provenance(self) -> None:
        """Write provenance.json and the MLflow tags of `ctx.provenance` (again, after a job added to it)."""
        self.write_text("provenance.json", json.dumps(self.provenance, indent=2, sort_keys=True, default=str) + "\n")
        self._tracker.set_tags(provenance.tags(self.provenance))

    def record_resolved(self, values: dict[str, str]) -> None:
        """Keys left "" (= as the checkpoint says) as the job resolved them, so that config.yaml and the MLflow
        params record what was used. After the run has started: config.yaml rewritten, and MLflow tags
        `wxray.resolved.<key>` (params cannot change once logged)."""
        for key, value in values.items():
            setattr(self.cfg, key, value)
        if self.started:
            self.write_text("config.yaml", dump_yaml(redact("", to_dict(self.cfg))))
            self._tracker.set_tags({f"wxray.resolved.{k}": str(redact(k, v)) for k, v in values.items()})

    def release(self) -> None:
        """Give up the run directory (its lock)."""
        self._held.close()

    def rollback(self) -> None:
        """Leave the run directory as it was before the job (unless `keep_on_failure`)."""
        if self.keep_on_failure or self._before is None:
            return
        if self._created:
            shutil.rmtree(self._created, ignore_errors=True)
            return
        for p in self._out_dir.iterdir():
            if p.name not in self._before:
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() and not p.is_symlink() else p.unlink()
        for path, content in self._backups.items():
            path.write_bytes(content)


def default_out_dir(job: str) -> Path:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    return Path("runs") / job / stamp


def _failed(ctx: JobContext, msg: str) -> int:
    """Bad input after the job may have started: end its MLflow run FAILED, roll back, one line."""
    ctx.rollback()  # first: on a full disk this frees the space the tracking store may need
    if ctx.started:
        with contextlib.suppress(Exception):  # the MLflow store may sit on the same full disk
            ctx.tracker.set_tags({"wxray.error": msg[:5000]})
            ctx.tracker.end("FAILED")
    return _fail(msg)


def _disk_full(error: BaseException, cfg: JobConfig, kept: bool) -> str | None:
    """The one line for a write that ran out of space (ENOSPC, EDQUOT) anywhere in the error's chain."""
    e: BaseException | None = error
    while e is not None:
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            outputs = [getattr(o, n) for o, n, _, m in path_keys(cfg) if m.output and getattr(o, n)]
            where = e.filename or " or ".join(dict.fromkeys(str(p) for p in outputs))
            free = human(free_disk(e.filename or cfg.out_dir))
            left = (f"what was written stays in {cfg.out_dir}: free space and the same command continues" if kept
                    else "nothing was kept; free space or write elsewhere")
            return f"no space left on the device writing {where} ({free} free): {left}"
        e = e.__cause__ or e.__context__
    return None


def _fail(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr, flush=True)
    return 2


def usage(job: str, cfg_cls: type, doc: str | None = None) -> str:
    head = (doc or "").strip() or f"wxray job {job}"
    return "\n".join([head, "", "Options: --config FILE (YAML), key=value overrides (applied in order), "
                      "--verbose (Ray's own log output), --help.", "", "Keys:", *describe(cfg_cls)])


def prepare(job: str, cfg_cls: type[C], argv: list[str]) -> C:
    """Load, resolve and check a job config (everything that can fail before any work starts)."""
    cfg = load_config(cfg_cls, argv)
    if cfg.anonymous:  # before anything is read, and before Ray starts: its workers inherit it
        location.read_anonymously()
    resolve_paths(cfg, resolve_path)
    if not cfg.out_dir:
        cfg.out_dir = str(resolve_path(default_out_dir(job)))
    check_run_name(cfg.run_name)
    outputs, inputs = {}, {}
    for owner, name, key, marker in path_keys(cfg):
        value = getattr(owner, name)
        if (not value or location.is_remote(value) or value.startswith(MODEL_URIS) or value in marker.keywords
                or any(c in value for c in "*?[")):
            continue
        if marker.output:
            check_writable(value, key)
            outputs[key] = (value, key == "out_dir")
        else:
            inputs[key] = (value, marker.holds_runs)
    check_apart(outputs, inputs)
    check_run_dir(cfg.out_dir, cfg.out_dir_reuse)
    cfg.tracking.experiment = cfg.tracking.experiment or cfg.experiment
    if cfg.tracking.enabled:
        cfg.tracking.uri = resolve_uri(cfg.tracking.uri)
        warning = check_server(cfg.tracking)  # a server that does not answer: ConfigError, or the local store
        if warning:
            say(warning)
        if cfg.tracking.uri.startswith("sqlite:///"):
            check_writable(Path(cfg.tracking.uri[len("sqlite:///"):]).parent, "tracking.uri", replace=False)
    return cfg


def run_job(job: str, cfg_cls: type[C], main: Callable[[C, JobContext], dict[str, Any]],
            argv: list[str] | None = None, doc: str | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--help" in argv or "-h" in argv:
        print(usage(job, cfg_cls, doc))
        return 0
    if "--verbose" in argv:
        argv.remove("--verbose")
        os.environ[VERBOSE_ENV] = "1"
    try:
        cfg = prepare(job, cfg_cls, argv)
    except WxrayError as e:
        return _fail(str(e))
    if under_job_submission() and not os.environ.get("WXRAY_HOME"):
        say(f"running under ray job submit without WXRAY_HOME: outputs go under {home()}")

    ctx = JobContext(job, cfg, Path(cfg.out_dir))
    try:
        result = main(cfg, ctx)
        tracker = ctx.tracker  # a job that never logged starts here
        result = {**result, "out_dir": str(ctx.out_dir)}
        if tracker.run_id:
            result.setdefault("mlflow_run_id", tracker.run_id)
            result.setdefault("mlflow_uri", redact_uri(tracker.uri))
        if cfg.tracking.fallback:
            result["tracking_fallback"] = cfg.tracking.fallback
        taken = [ctx.provenance.get("store"), *ctx.provenance.get("obs_streams", {}).values()]
        known = {fp["path"]: fp for fp in taken if isinstance(fp, dict) and "path" in fp}
        ctx.provenance.setdefault("inputs", provenance.input_fingerprints(cfg, known))
        ctx.record_provenance()
        write_json(ctx.out_dir / "summary.json", {**result, "provenance": ctx.provenance})
        for name in ("summary.json", "config.yaml", "provenance.json"):
            tracker.log_artifact(ctx.out_dir / name)
        if ctx.mirror:
            location.put(ctx.out_dir, ctx.mirror, exclude=("ray", RUN_LOCK))
        tracker.end("FINISHED")
        if tracker.run_url:
            say(f"MLflow run: {tracker.run_url}")
    except WxrayError as e:
        return _failed(ctx, str(e))
    except KeyboardInterrupt:
        if ctx.started:
            ctx.tracker.end("KILLED")
        ctx.rollback()
        kept = f": its checkpoints stay in {cfg.out_dir}; the same command resumes" if ctx.keep_on_failure else ""
        _fail(f"interrupted{kept}")
        return INTERRUPTED
    except BaseException as e:
        corrupt = integrity.explain(e) if isinstance(e, Exception) else None
        if corrupt:  # a chunk that does not decode is bad input, deep in a lazy read
            return _failed(ctx, corrupt)
        full = _disk_full(e, cfg, ctx.keep_on_failure)
        if full:
            return _failed(ctx, full)
        # A bug, not bad input: keep the traceback, but do not leave the MLflow run "RUNNING".
        if ctx.started:
            ctx.tracker.end("FAILED")
        raise
    finally:
        ctx.release()
    print("RESULT " + json.dumps(result, sort_keys=True, default=str), flush=True)
    return 0
