"""A local Ray head for `ray job submit` (`make ray-up`, `make submit`, `make ray-down`).

A head needs four fixed ports: the GCS (6379), the dashboard with its job server (8265), the dashboard agent
that runs submitted jobs (52365) and the Ray client server (10001). Another Ray on the machine (a test session,
a notebook's `ray.init()`) often holds the agent's port; the head then starts and its dashboard answers, but
every submission fails with "No available agent". So `up` checks every port before it starts anything and says
which one is taken, and reports the head up only when the agent answers on the port given to it.

`down` sends the head's process group SIGTERM and waits until it is gone (a head drains for up to a minute),
so that a following `up` finds its ports free. `submit` runs `ray job submit` and turns the CLI's traceback
into one line.

    python -m wxray.platform.cluster.head up --pid runs/ray-head.pid --log runs/ray-head.log [--port 6379 ...]
    python -m wxray.platform.cluster.head submit --dashboard-port 8265 -- <ray job submit arguments>
    python -m wxray.platform.cluster.head down --pid runs/ray-head.pid
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

# (flag of `ray start`, what the port is for, its default)
PORTS = (("port", "the GCS (Ray's address)", 6379),
         ("dashboard-port", "the dashboard and its job server", 8265),
         ("dashboard-agent-listen-port", "the dashboard agent that runs submitted jobs", 52365),
         ("ray-client-server-port", "the Ray client server (ray://)", 10001))
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 90.0


class HeadError(RuntimeError):
    """Why the head cannot be started, stopped or submitted to: one line."""


def port_taken(port: int) -> str | None:
    """Why `port` cannot be bound on every interface (as Ray binds it), or None when it is free."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("", port))
        except OSError as e:
            return "in use" if e.errno == errno.EADDRINUSE else (e.strerror or type(e).__name__)
    return None


def check_ports(ports: dict[str, int]) -> None:
    """HeadError naming every taken port, its flag and what it is for; the Makefile variable moves it."""
    what = {flag: text for flag, text, _ in PORTS}
    taken = [f"{port} ({what[flag]}, --{flag}): {why}" for flag, port in ports.items()
             if (why := port_taken(port)) is not None]
    if taken:
        raise HeadError("cannot start the Ray head, port " + "; port ".join(taken) +
                        " - another Ray or program holds it: stop it, or pick free ports "
                        "(make ray-up RAY_PORT=... RAY_DASHBOARD_PORT=... RAY_AGENT_PORT=... RAY_CLIENT_PORT=...)")


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2)
    except urllib.error.HTTPError:  # it answers (the dashboard asks for Ray's token)
        return True
    except OSError:
        return False
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read_pid(pid_file: Path) -> int | None:
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _alive(pid) else None


def up(ports: dict[str, int], cpus: int, pid_file: Path, log_file: Path, ray: str = "ray",
       timeout_s: float = START_TIMEOUT_S, env: dict[str, str] | None = None) -> int:
    """Start `ray start --head --block` in a process group of its own; its pid goes to `pid_file`. Returns
    once the dashboard and the head's own job agent answer; HeadError (and the head stopped) otherwise."""
    running = _read_pid(pid_file)
    if running is not None:
        raise HeadError(f"a Ray head started by make is already running (pid {running}); stop it with make ray-down")
    check_ports(ports)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    argv = [ray, "start", "--head", "--block", *(f"--{flag}={port}" for flag, port in ports.items()),
            f"--num-cpus={cpus}", "--disable-usage-stats"]
    with open(log_file, "wb") as log:
        head = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    pid_file.write_text(f"{head.pid}\n")
    dashboard = f"http://127.0.0.1:{ports['dashboard-port']}/api/version"
    agent = f"http://127.0.0.1:{ports['dashboard-agent-listen-port']}/api/healthz"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if head.poll() is not None:
            pid_file.unlink(missing_ok=True)
            raise HeadError(f"the Ray head exited with status {head.returncode} while starting; see {log_file}")
        if _answers(dashboard) and _answers(agent):
            return head.pid
        time.sleep(1.0)
    down(pid_file)
    raise HeadError(f"the Ray head did not answer on ports {ports['dashboard-port']} (dashboard) and "
                    f"{ports['dashboard-agent-listen-port']} (job agent) within {timeout_s:g} s; see {log_file}")


def down(pid_file: Path, timeout_s: float = STOP_TIMEOUT_S, say=print) -> bool:
    """Stop the head's process group and wait until every process of it is gone. False if there was none."""
    pid = _read_pid(pid_file)
    pid_file.unlink(missing_ok=True)
    if pid is None:
        return False
    os.killpg(pid, signal.SIGTERM)
    say("stopping the Ray head started by make ray-up (it drains for up to a minute) ...")
    deadline = time.monotonic() + timeout_s
    while group_alive(pid):
        if time.monotonic() > deadline:
            os.killpg(pid, signal.SIGKILL)
            say(f"the Ray head did not stop within {timeout_s:g} s: killed it")
            break
        time.sleep(0.5)
    return True


def group_alive(pgid: int) -> bool:
    try:  # the leader, when it is this process's child (a test), is a zombie until reaped
        os.waitpid(pgid, os.WNOHANG)
    except ChildProcessError:
        pass
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def submit(dashboard_port: int, argv: list[str], ray: str = "ray") -> int:
    """`ray job submit --address http://127.0.0.1:<port> <argv>`: the job's output as it comes; a failure of
    the submission itself (no head, no agent, a runtime env that cannot be built) as one line."""
    address = f"http://127.0.0.1:{dashboard_port}"
    if not _answers(f"{address}/api/version"):
        raise HeadError(f"no Ray head answers at {address}: start one with make ray-up")
    proc = subprocess.run([ray, "job", "submit", "--address", address, *argv], stderr=subprocess.PIPE, text=True)
    err = proc.stderr or ""
    if proc.returncode != 0 and "Traceback (most recent call last)" in err:
        raise HeadError(f"ray job submit to {address} failed: {_last_error(err)}")
    sys.stderr.write(err)
    return proc.returncode


def _last_error(stderr: str) -> str:
    """The exception line of a traceback, reduced to the server's own words (and what to do about no agent)."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    tail = [ln for ln in lines if not ln.startswith(("File ", "Traceback", "^", "~"))]
    text = next((ln for ln in lines if "No available agent" in ln), tail[-1] if tail else "see the output above")
    text = re.sub(r"^\w+(Error|Exception): ", "", text)
    text = re.sub(r"^Request failed with status code \d+: ", "", text).rstrip(".") + "."
    if "No available agent" in text:
        text += (" The head's job agent is not running: its port may be held by another Ray "
                 "(make ray-down, then make ray-up names a taken port)")
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m wxray.platform.cluster.head")
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("up")
    for flag, _, default in PORTS:
        start.add_argument(f"--{flag}", type=int, default=default)
    start.add_argument("--cpus", type=int, default=os.cpu_count() or 1)
    start.add_argument("--pid", type=Path, required=True)
    start.add_argument("--log", type=Path, required=True)
    start.add_argument("--ray", default="ray")
    stop = sub.add_parser("down")
    stop.add_argument("--pid", type=Path, required=True)
    send = sub.add_parser("submit")
    send.add_argument("--dashboard-port", type=int, default=8265)
    send.add_argument("--ray", default="ray")
    send.add_argument("rest", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            ports = {flag: getattr(args, flag.replace("-", "_")) for flag, _, _ in PORTS}
            pid = up(ports, args.cpus, args.pid, args.log, ray=args.ray)
            print(f"Ray head up (pid {pid}; dashboard http://127.0.0.1:{ports['dashboard-port']}, job agent on "
                  f"{ports['dashboard-agent-listen-port']}): submit with make submit ARGS=...; stop with "
                  f"make ray-down (log: {args.log})")
        elif args.command == "down":
            print("stopped the Ray head started by make ray-up" if down(args.pid)
                  else "no Ray head started by make ray-up is running")
        else:
            rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
            return submit(args.dashboard_port, rest, ray=args.ray)
    except HeadError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
