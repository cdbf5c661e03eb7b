"""Tracking at job start: a server that does not answer (error, or tracking.required=false: the local store),
provenance recorded in MLflow / summary.json / provenance.json, and no credentials in params or config.yaml."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time
from dataclasses import dataclass
from types import SimpleNamespace

import mlflow
import pytest

from wxray.config import flatten, to_dict
from wxray.job import JobConfig, run_job
from wxray.tracking import Tracker, TrackingConfig, check_server, probe_server, redact, redact_uri


def _unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class SecretConfig(JobConfig):
    seed: int = 7
    api_token: str = ""


def secret_main(cfg, ctx):
    ctx.provenance["store"] = {"path": "/data/s.zarr", "metadata_sha256": "abc"}  # added before the start
    ctx.tracker.log_metrics({"m": 1.0})
    ctx.provenance["late"] = "added after the start"
    return {"ok": True}


def _result(out: str) -> dict:
    return json.loads([ln for ln in out.splitlines() if ln.startswith("RESULT ")][-1][len("RESULT "):])


def test_a_server_that_does_not_answer_is_one_line_before_any_work(tmp_path, capsys):
    uri = f"http://127.0.0.1:{_unused_port()}"
    out = tmp_path / "run"
    t0 = time.monotonic()
    rc = run_job("toy", SecretConfig, secret_main, [f"out_dir={out}", f"tracking.uri={uri}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and time.monotonic() - t0 < 10
    assert err[0].startswith(f"error: tracking server {uri} does not answer (")
    assert "make mlflow-server" in err[0] and "tracking.required=false" in err[0]
    assert not out.exists()


def test_required_false_falls_back_to_the_local_store_and_records_provenance(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WXRAY_HOME", str(tmp_path))
    uri = f"http://user:pw@127.0.0.1:{_unused_port()}"
    out = tmp_path / "run"
    rc = run_job("toy", SecretConfig, secret_main,
                 [f"out_dir={out}", f"tracking.uri={uri}", "tracking.required=false", "api_token=hunter2"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    local = f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}"
    assert f"tracking server http://user:***@127.0.0.1:{uri.rsplit(':', 1)[1]} does not answer" in cap.out
    assert "pw@" not in cap.out + cap.err
    result = _result(cap.out)
    assert result["tracking_fallback"] == local and result["mlflow_uri"] == local
    assert "provenance" not in result  # RESULT stays short; summary.json has the block
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tracking_fallback"] == local
    prov = summary["provenance"]
    assert prov == json.loads((out / "provenance.json").read_text())
    assert prov["seeds"] == {"seed": 7} and prov["late"] == "added after the start"
    assert set(prov["git"]) == {"commit", "dirty"} and prov["versions"]["mlflow"] == mlflow.__version__
    saved = (out / "config.yaml").read_text()
    assert "hunter2" not in saved and "api_token: '***'" in saved and f"uri: {local}" in saved

    run = mlflow.tracking.MlflowClient(local).get_run(result["mlflow_run_id"])
    assert run.data.params["api_token"] == "***" and run.data.params["tracking.uri"] == local
    tags = run.data.tags
    assert tags["wxray.git_commit"] == prov["git"]["commit"]
    assert tags["wxray.git_dirty"] == str(prov["git"]["dirty"]).lower()
    assert tags["wxray.store"] == "/data/s.zarr" and tags["wxray.store_sha256"] == "abc"
    assert tags["wxray.mlflow"] == mlflow.__version__ and "wxray.python" in tags


def test_probe_takes_any_http_answer_but_a_server_error(monkeypatch):
    status = {"code": 200}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(status["code"] if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        uri = f"http://127.0.0.1:{server.server_address[1]}"
        assert probe_server(uri) is None and probe_server(uri + "/") is None
        status["code"] = 401  # basic auth: the server is up
        assert probe_server(uri) is None
        status["code"] = 502  # a proxy whose server is down
        assert probe_server(uri) == "it answered HTTP 502"
        cfg = TrackingConfig(uri=uri, required=True)
        with pytest.raises(Exception, match=f"tracking server {uri} does not answer"):
            check_server(cfg)
    finally:
        server.shutdown()
    assert check_server(TrackingConfig(uri="sqlite:////tmp/x.db")) is None  # no server, nothing to probe
    assert check_server(TrackingConfig(uri="http://127.0.0.1:1", enabled=False)) is None


def test_credentials_never_reach_mlflow_params():
    @dataclass
    class Db:
        host: str = "db"
        password: str = ""
        num_tokens: int = 4  # an ML key, not a credential

    @dataclass
    class Cfg(JobConfig):
        db: Db = None
        hf_token: str = "hf_abc"
        secret_key: str = "s"
        token_kwargs: str = "a,b"

    cfg = Cfg(db=Db(password="pw"))
    cfg.tracking.uri = "https://alice:s3cret@mlflow.example.org"
    logged: dict = {}
    fake = SimpleNamespace(get_run=lambda run_id: SimpleNamespace(data=SimpleNamespace(params={}, tags={})),
                           log_params=logged.update, set_tags=logged.update, delete_tag=lambda k: None)
    tracker = Tracker(TrackingConfig(enabled=False), run_name="x")
    tracker.enabled, tracker.run_id, tracker._mlflow = True, "r", fake
    tracker.log_params(flatten(to_dict(cfg)))
    assert logged["db.password"] == logged["hf_token"] == logged["secret_key"] == "***"
    assert logged["db.num_tokens"] == "4" and logged["token_kwargs"] == "a,b" and logged["db.host"] == "db"
    assert logged["tracking.uri"] == "https://alice:***@mlflow.example.org"
    assert "s3cret" not in json.dumps(logged) and "pw" not in logged.values()
    assert redact("db", {"password": "", "user": "u"}) == {"password": "", "user": "u"}  # nothing to hide
    assert redact_uri("see postgresql://u:p@h:5432/db and http://h/x") == "see postgresql://u:***@h:5432/db and " \
                                                                       "http://h/x"
