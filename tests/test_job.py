from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass

import mlflow
import pytest

from wxray.errors import ConfigError, DataError
from wxray.io import check_writable, lock
from wxray.job import JobConfig, run_job


@dataclass
class ToyConfig(JobConfig):
    x: float = 1.0
    fail: bool = False


def toy_main(cfg, ctx):
    if cfg.fail:
        (ctx.out_dir / "partial.bin").write_text("x")
        raise DataError("source foo.grib: variable 'temperature' not found")
    ctx.tracker.log_metrics({"double": 2 * cfg.x}, step=0)
    return {"double": 2 * cfg.x}


def test_job_writes_summary_logs_mlflow_and_prints_result(tmp_path, tracking_uri, capsys):
    out = tmp_path / "run"
    rc = run_job("toy", ToyConfig, toy_main, [f"out_dir={out}", "x=3", f"tracking.uri={tracking_uri}"])
    assert rc == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("RESULT ")
    result = json.loads(last[len("RESULT "):])
    assert result["double"] == 6.0
    assert json.loads((out / "summary.json").read_text())["double"] == 6.0
    assert "x: 3.0" in (out / "config.yaml").read_text()
    mlflow.set_tracking_uri(tracking_uri)
    run = mlflow.get_run(result["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.metrics["double"] == 6.0
    assert run.data.params["x"] == "3.0"
    # artifacts sit beside the sqlite store, not in ./mlruns of the working directory
    assert run.info.artifact_uri.startswith((tmp_path / "mlartifacts").as_uri())
    assert (tmp_path / "mlartifacts").is_dir()


def test_bad_input_is_one_line_exit_2_and_no_run_dir(tmp_path, tracking_uri, capsys):
    out = tmp_path / "run"
    rc = run_job("toy", ToyConfig, toy_main, [f"out_dir={out}", "fail=true", f"tracking.uri={tracking_uri}"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert rc == 2
    assert err == "error: source foo.grib: variable 'temperature' not found"
    assert not out.exists()


def test_bad_config_fails_before_any_work(tmp_path, capsys):
    out = tmp_path / "run"
    rc = run_job("toy", ToyConfig, toy_main, [f"out_dir={out}", "x=abc"])
    assert rc == 2
    assert "config key 'x' expects float" in capsys.readouterr().err
    assert not out.exists()


def test_experiments_open_on_the_runs_table_and_runs_are_named_by_what_they_are(tmp_path, tracking_uri, capsys):
    rc = run_job("toy", ToyConfig, toy_main, [f"out_dir={tmp_path / 'run'}", f"tracking.uri={tracking_uri}"])
    assert rc == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1][len("RESULT "):])
    client = mlflow.tracking.MlflowClient(tracking_uri)
    run = client.get_run(result["mlflow_run_id"])
    experiment = client.get_experiment(run.info.experiment_id)
    assert experiment.name == "wxray"  # JobConfig's experiment; jobs set their own (wxray-train, ...)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    assert run.info.run_name == "toy-run"
    saved = (tmp_path / "run" / "config.yaml").read_text()  # the resolved values, not the blanks
    for line in (f"out_dir: {tmp_path / 'run'}", "run_name: toy-run", f"uri: {tracking_uri}", "experiment: wxray"):
        assert line in saved, (line, saved)


def test_under_ray_job_submit_outputs_go_to_the_wxray_home(tmp_path, monkeypatch, capsys):
    """Ray runs a submitted job in a temporary copy of the working directory: nothing may land there."""
    copy = tmp_path / "ray_session" / "runtime_resources" / "working_dir_files" / "_ray_pkg_x"
    copy.mkdir(parents=True)
    home = tmp_path / "project"
    monkeypatch.chdir(copy)
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}")
    monkeypatch.setenv("WXRAY_HOME", str(home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert run_job("toy", ToyConfig, toy_main, ["out_dir=runs/exp", "x=2"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1][len("RESULT "):])
    assert result["out_dir"] == str(home / "runs" / "exp")
    assert (home / "runs" / "exp" / "summary.json").exists() and (home / "runs" / "mlflow.db").exists()
    assert result["mlflow_uri"] == f"sqlite:///{home / 'runs' / 'mlflow.db'}"
    assert list(copy.iterdir()) == []
    # Without WXRAY_HOME the outputs still leave the temporary copy: ~/wxray, said on the console.
    monkeypatch.delenv("WXRAY_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    assert run_job("toy", ToyConfig, toy_main, []) == 0
    out = capsys.readouterr().out
    assert f"outputs go under {tmp_path / 'user' / 'wxray'}" in out
    assert list(copy.iterdir()) == [] and (tmp_path / "user" / "wxray" / "runs" / "toy").is_dir()


def test_a_failing_job_leaves_an_existing_run_directory_as_it_was(tmp_path, tracking_uri, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.yaml").write_text("x: 7.0\n")
    (out / "notes.txt").write_text("mine")
    rc = run_job("toy", ToyConfig, toy_main, [f"out_dir={out}", "fail=true", f"tracking.uri={tracking_uri}"])
    assert rc == 2
    assert sorted(p.name for p in out.iterdir()) == ["config.yaml", "notes.txt"]
    assert (out / "config.yaml").read_text() == "x: 7.0\n"


def test_path_keys_expand_home_anchor_globs_and_leave_urls(tmp_path, monkeypatch):
    from wxray.config import resolve_paths
    from wxray.io import resolve_path
    from wxray.prepare.stores import PrepareDataConfig

    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    monkeypatch.setenv("WXRAY_HOME", str(tmp_path / "home"))
    for source, expected in (("~/era5/*.grib", str(tmp_path / "user" / "era5" / "*.grib")),
                             ("era5/*.nc", str(tmp_path / "home" / "era5" / "*.nc")),
                             ("gs://bucket/era5/*.nc", "gs://bucket/era5/*.nc")):
        cfg = PrepareDataConfig(source=source, out="o.zarr")
        resolve_paths(cfg, resolve_path)
        assert (cfg.source, cfg.out) == (expected, str(tmp_path / "home" / "o.zarr"))


def test_a_failing_job_removes_the_folders_it_created(tmp_path, tracking_uri, capsys):
    out = tmp_path / "new" / "deeper" / "run"
    rc = run_job("toy", ToyConfig, toy_main, [f"out_dir={out}", "fail=true", f"tracking.uri={tracking_uri}"])
    assert rc == 2 and not (tmp_path / "new").exists()


def test_replacing_an_output_needs_a_writable_parent(tmp_path):
    store = tmp_path / "locked" / "out.zarr"
    store.mkdir(parents=True)
    check_writable(store, "out")
    locked = tmp_path / "locked"
    lock = ["chattr", "+i", str(locked)] if os.geteuid() == 0 else ["chmod", "555", str(locked)]
    subprocess.run(lock, check=True)  # root ignores permissions: an immutable folder stops it too
    try:
        with pytest.raises(ConfigError, match=f"config key 'out': {locked} is not writable"):
            check_writable(store, "out")
        check_writable(store, "out", replace=False)  # writing inside the store alone is fine
    finally:
        subprocess.run(["chattr", "-i", str(locked)] if os.geteuid() == 0 else ["chmod", "755", str(locked)])


def test_ctrl_c_is_one_line_exit_130_killed_and_nothing_left(tmp_path, tracking_uri, capsys):
    def interrupted(cfg, ctx):
        (ctx.out_dir / "half.zarr").mkdir()
        raise KeyboardInterrupt

    out = tmp_path / "run"
    rc = run_job("toy", ToyConfig, interrupted, [f"out_dir={out}", f"tracking.uri={tracking_uri}"])
    assert rc == 130 and capsys.readouterr().err.strip() == "error: interrupted"
    assert not out.exists()
    runs = mlflow.search_runs(experiment_names=["wxray"], output_format="list")
    assert [r.info.status for r in runs] == ["KILLED"]


def test_a_run_directory_in_use_by_another_job_is_refused(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    with lock(out / ".wxray.lock", wait=False):  # as a running job holds it
        rc = run_job("toy", ToyConfig, toy_main, [f"out_dir={out}", "tracking.enabled=false"])
        err = capsys.readouterr().err.strip()
        assert rc == 2 and f"config key 'out_dir': {out} is in use by another wxray job (pid {os.getpid()}" in err
        assert [p.name for p in out.iterdir()] == [".wxray.lock"]
    assert run_job("toy", ToyConfig, toy_main, [f"out_dir={out}", "tracking.enabled=false"]) == 0
    assert not (out / ".wxray.lock").exists() and (out / "summary.json").is_file()


@pytest.mark.slow
def test_two_jobs_on_one_run_directory_at_once(tmp_path):
    """Real processes: the first to start holds the folder until the other has been refused."""
    out, go = tmp_path / "run", tmp_path / "go"
    code = ("import pathlib, sys, time; from wxray.job import run_job; from tests.test_job import ToyConfig\n"
            "def main(cfg, ctx):\n"
            "    ctx.start()\n"
            f"    while not pathlib.Path({str(go)!r}).exists(): time.sleep(0.1)\n"
            "    return {'x': cfg.x}\n"
            "sys.exit(run_job('toy', ToyConfig, main, sys.argv[1:]))")
    procs = [subprocess.Popen([sys.executable, "-c", code, f"out_dir={out}", f"x={i}", "tracking.enabled=false"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in (1, 2)]
    refused = None
    for _ in range(1200):
        refused = next((p for p in procs if p.poll() is not None), None)
        if refused:
            break
        time.sleep(0.1)
    go.touch()
    done = [(p.wait(timeout=120), p.stdout.read(), p.stderr.read()) for p in procs]
    assert refused is not None and refused.returncode == 2, done
    assert sorted(rc for rc, _, _ in done) == [0, 2], done
    winner = next(o for rc, o, _ in done if rc == 0)
    x = json.loads(winner.strip().splitlines()[-1][len("RESULT "):])["x"]
    assert json.loads((out / "summary.json").read_text())["x"] == x and f"x: {x}" in (out / "config.yaml").read_text()
    assert "in use by another wxray job" in next(e for rc, _, e in done if rc == 2)
