from __future__ import annotations

import json
from dataclasses import dataclass

import mlflow

from wxray.errors import DataError
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
