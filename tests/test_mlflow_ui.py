"""The MLflow UI in a real browser (headless Chromium driven by Playwright): the links wxray prints open a
first-time visitor (empty localStorage) on the experiment's runs table with the job's metrics as columns, not
on MLflow 3's GenAI overview; the run link opens the run; the bare address, served as `make mlflow-ui` serves
it (`--app-name wxray`), opens in model-training mode. `wxray.tracking_view` and `wxray.tracking_ui` say why."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.mlflow_db import fresh_uri
from wxray import tracking_view
from wxray.tracking import Tracker, TrackingConfig

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# As the machine's probe runs it: no background connections, which a closed network refuses many at a time.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-sync",
                 "--disable-background-networking", "--disable-component-update"]


def test_view_state_merges_columns_in_pattern_order():
    metrics = ["train/lr", "val/rmse/geopotential", "val/loss", "val/rmse/2m_temperature"]
    chosen = tracking_view.chosen(metrics, ("val/loss", "val/rmse/*", "val/*"))
    assert chosen == ["val/loss", "val/rmse/2m_temperature", "val/rmse/geopotential"]
    first = json.loads(tracking_view.view_state(None, chosen[:1]))
    assert first["selectedColumns"] == ["metrics.`val/loss`"] and first["orderByKey"] == "attributes.start_time"
    merged = json.loads(tracking_view.view_state(json.dumps(first), chosen))
    assert merged["selectedColumns"] == [tracking_view.column(m) for m in chosen]
    assert tracking_view.view_state(json.dumps(merged), chosen[1:]) is None  # nothing new: left as it is
    assert tracking_view.view_state("not json", [])  # a broken tag is replaced
    assert tracking_view.column("a`b") == "metrics.`a``b`"


def test_every_experiment_has_its_view_and_the_finished_run_adds_columns(tmp_path):
    uri = fresh_uri(tmp_path)
    tracker = _toy_run(uri)
    import mlflow

    client = mlflow.MlflowClient(uri)
    tags = client.get_experiment(tracker.experiment_id).tags
    assert tags["mlflow.experimentKind"] == "custom_model_development"
    assert json.loads(tags[tracking_view.VIEW_TAG])["selectedColumns"] == [
        "metrics.`val/loss`", "metrics.`val/rmse/geopotential`"]
    failed = Tracker(TrackingConfig(uri=uri, experiment="wxray-train"), "failed", columns=("train/*",))
    failed.log_metrics({"train/lr": 1e-3})
    failed.end("FAILED")  # a failed run changes nothing the table shows
    assert client.get_experiment(tracker.experiment_id).tags[tracking_view.VIEW_TAG] == tags[tracking_view.VIEW_TAG]


def test_mlflow_ui_prints_one_link_per_experiment(tmp_path, capsys):
    uri = fresh_uri(tmp_path)
    tracker = _toy_run(uri)
    assert tracking_view.main([uri, "http://127.0.0.1:5000"]) == 0
    out = capsys.readouterr().out
    assert out.split() == ["wxray-train", f"http://127.0.0.1:5000/#/experiments/{tracker.experiment_id}/runs"
                                          "?viewStateShareKey=wxray&workflowType=machine_learning"]


def test_the_ui_page_sets_model_training_for_a_first_visit_only():
    from mlflow.server import app

    from wxray import tracking_ui

    client = app.test_client()
    page = client.get("/").get_data(as_text=True)
    script = tracking_ui.DEFAULT_MODE_SCRIPT
    assert page.count(script) == 1 and page.index(script) < page.index("</head>")
    assert "localStorage.getItem(\"mlflow.workflowType_v1\")===null" in tracking_ui.DEFAULT_MODE_SCRIPT
    assert tracking_ui.DEFAULT_MODE_SCRIPT not in client.get("/health").get_data(as_text=True)
    # MLflow's UI keeps the toggle as key + "_v" + version: still version 1 of "mlflow.workflowType"
    assert 'key:"mlflow.workflowType",version:1,' in _ui_bundle()


def _ui_bundle() -> str:
    from mlflow.server import app

    js = Path(app.static_folder) / "static" / "js"
    return "".join(f.read_text(errors="ignore") for f in js.glob("main.*.js"))


def _toy_run(uri: str) -> Tracker:
    tracker = Tracker(TrackingConfig(uri=uri, experiment="wxray-train"), "toy-run",
                      columns=("val/loss", "val/rmse/*"))
    for step in range(3):
        tracker.log_metrics({"val/loss": 1.0 / (step + 1), "val/rmse/geopotential": 100.0 - step, "train/lr": 1e-3},
                            step=step)
    tracker.end()
    return tracker


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (Debian: apt-get install chromium); .ci/run installs it")
def test_the_printed_links_open_the_runs_table_in_a_fresh_browser(tmp_path):
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    uri = fresh_uri(tmp_path)
    tracker = _toy_run(uri)
    port = free_port()
    ui = subprocess.Popen([str(Path(sys.executable).parent / "mlflow"), "ui", "--app-name", "wxray",
                           "--backend-store-uri", uri, "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_for(f"{base}/health", ui)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_context(viewport={"width": 1600, "height": 1000}).new_page()  # empty localStorage
            page.goto(tracking_view.experiment_url(base, tracker.experiment_id))
            table = page.get_by_role("grid")
            table.get_by_text("val/rmse/geopotential").wait_for(timeout=90_000)
            text = page.inner_text("body")
            assert "Detect Issues" not in text and "Token Usage" not in text  # not the GenAI overview
            header = table.inner_text()
            assert "toy-run" in header and "val/loss" in header and "train/lr" not in header
            assert "/runs?" in page.url and "workflowType=machine_learning" in page.url
            page.screenshot(path=str(tmp_path / "runs_table.png"))
            page.goto(tracking_view.run_url(base, tracker.experiment_id, tracker.run_id))
            page.get_by_text("toy-run").first.wait_for(timeout=60_000)
            page.get_by_text("val/rmse/geopotential").first.wait_for(timeout=60_000)
            assert "Detect Issues" not in page.inner_text("body")
            # The bare address in a fresh browser: model training mode, so the experiment opens on its runs table.
            page = browser.new_context(viewport={"width": 1600, "height": 1000}).new_page()
            page.goto(base + "/")
            page.get_by_text("wxray-train").first.click(timeout=90_000)
            page.get_by_role("grid").get_by_text("toy-run").wait_for(timeout=90_000)
            assert "/runs" in page.url and "workflowType=machine_learning" in page.url
            assert "Detect Issues" not in page.inner_text("body") and "Token Usage" not in page.inner_text("body")
            page.evaluate("localStorage.setItem('mlflow.workflowType_v1', JSON.stringify('genai'))")
            page.goto(base + "/")  # a visitor who chose GenAI keeps it
            page.wait_for_load_state()
            assert page.evaluate("localStorage.getItem('mlflow.workflowType_v1')") == '"genai"'
            browser.close()
    finally:
        subprocess.run(["pkill", "-TERM", "-g", str(ui.pid)], check=False)
        ui.wait(timeout=30)


def _wait_for(url: str, proc: subprocess.Popen, seconds: float = 90.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            assert proc.poll() is None, f"mlflow ui exited with {proc.returncode}"
            time.sleep(0.5)
    raise AssertionError(f"mlflow ui did not answer at {url}")


def test_a_copied_runs_folder_keeps_its_artifacts_with_it(tmp_path, capsys):
    """A runs/ folder copied elsewhere: its experiments named the old artifact folder; new runs' artifacts go
    beside the copied store, and the old runs read theirs from the copy."""
    import shutil as sh

    import mlflow

    first = tmp_path / "a" / "runs"
    old = Tracker(TrackingConfig(uri=f"sqlite:///{first / 'mlflow.db'}", experiment="wxray-train"), "old-run")
    (tmp_path / "note.txt").write_text("hello")
    old.log_artifact(tmp_path / "note.txt")
    old.end()
    copy = tmp_path / "b" / "runs"
    sh.copytree(first, copy)
    uri = f"sqlite:///{copy / 'mlflow.db'}"
    capsys.readouterr()
    new = Tracker(TrackingConfig(uri=uri, experiment="wxray-train"), "new-run")
    new.log_artifact(tmp_path / "note.txt")
    new.end()
    assert "was made in another folder" in capsys.readouterr().out
    client = mlflow.MlflowClient(uri)
    here = (copy / "mlartifacts").resolve().as_uri()
    assert client.get_experiment(new.experiment_id).artifact_location == here
    for run_id in (old.run_id, new.run_id):
        run = client.get_run(run_id)
        assert run.info.artifact_uri.startswith(here + "/"), run.info.artifact_uri
    assert (copy / "mlartifacts").is_dir() and len(list((copy / "mlartifacts").rglob("note.txt"))) == 2
    assert len(list((first / "mlartifacts").rglob("note.txt"))) == 1  # the original folder is left alone
    again = Tracker(TrackingConfig(uri=uri, experiment="wxray-train"), "third")
    again.end()
    assert "another folder" not in capsys.readouterr().out  # once
