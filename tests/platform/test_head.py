"""`make ray-up` / `submit` / `ray-down` (wxray.platform.cluster.head) without starting Ray: a taken port is
named before anything starts, a failed submission is one line, and `down` waits for the head to drain. The
head itself starts in tests/platform/test_job_submit.py, which submits through it."""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.conftest import free_port
from wxray.platform.cluster import head

RAY = str(Path(sys.executable).parent / "ray")


def _ports(**taken: int) -> list[str]:
    ports = {flag: free_port() for flag, _, _ in head.PORTS} | taken
    return [f"--{flag}={port}" for flag, port in ports.items()]


def test_up_names_a_taken_port_and_starts_nothing(tmp_path, capsys):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        rc = head.main(["up", *_ports(**{"dashboard-agent-listen-port": port}), "--pid", str(tmp_path / "pid"),
                        "--log", str(tmp_path / "log"), "--ray", RAY])
    err = capsys.readouterr().err.strip()
    assert rc == 1 and len(err.splitlines()) == 1, err
    assert f"port {port} (the dashboard agent that runs submitted jobs, --dashboard-agent-listen-port): in use" in err
    assert "RAY_AGENT_PORT" in err
    assert not (tmp_path / "pid").exists() and not (tmp_path / "log").exists()


def test_up_refuses_while_its_head_runs(tmp_path, capsys):
    (tmp_path / "pid").write_text(f"{os.getpid()}\n")  # a live process stands for the running head
    rc = head.main(["up", *_ports(), "--pid", str(tmp_path / "pid"), "--log", str(tmp_path / "log")])
    assert rc == 1 and f"already running (pid {os.getpid()})" in capsys.readouterr().err


def test_down_waits_until_the_head_has_drained(tmp_path, capsys):
    # A stand-in head that, like `ray start --block`, takes a while to exit after SIGTERM.
    proc = subprocess.Popen(["bash", "-c", "trap 'sleep 1.5; exit 0' TERM; while :; do sleep 0.1; done"],
                            start_new_session=True)
    time.sleep(0.3)
    (tmp_path / "pid").write_text(f"{proc.pid}\n")
    start = time.monotonic()
    assert head.main(["down", "--pid", str(tmp_path / "pid")]) == 0
    assert time.monotonic() - start >= 1.0  # it did not return at once
    assert proc.poll() is not None and not (tmp_path / "pid").exists()
    out = capsys.readouterr().out
    assert "drains" in out and out.strip().endswith("stopped the Ray head started by make ray-up")
    assert head.main(["down", "--pid", str(tmp_path / "pid")]) == 0
    assert "no Ray head started by make ray-up is running" in capsys.readouterr().out


class _NoAgent(http.server.BaseHTTPRequestHandler):
    """A dashboard whose job server has no agent: what a head with a taken agent port answers."""

    def do_GET(self):  # noqa: N802 (http.server's names)
        body = json.dumps({"version": "4", "ray_version": "2.60.0", "ray_commit": "x"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):  # noqa: N802
        self.send_response(500)
        self.end_headers()
        self.wfile.write(b"No available agent to submit job, please try again later.")

    def log_message(self, *args):
        pass


def test_submit_without_an_agent_is_one_line(capsys):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NoAgent)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        rc = head.main(["submit", "--ray", RAY, "--dashboard-port", str(port), "--", "--", "python", "-V"])
    finally:
        server.shutdown()
    err = capsys.readouterr().err.strip()
    assert rc == 1 and len(err.splitlines()) == 1, err
    assert err.startswith(f"error: ray job submit to http://127.0.0.1:{port} failed: ") and "No available agent" in err
    assert "Traceback" not in err


def test_submit_without_a_head_is_one_line(capsys):
    port = free_port()
    assert head.main(["submit", "--ray", RAY, "--dashboard-port", str(port), "--", "--", "python", "-V"]) == 1
    assert capsys.readouterr().err.strip() == (f"error: no Ray head answers at http://127.0.0.1:{port}: "
                                               "start one with make ray-up")


def test_a_bound_port_is_taken_on_every_interface():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        assert head.port_taken(held.getsockname()[1]) == "in use"
    assert head.port_taken(free_port()) is None
