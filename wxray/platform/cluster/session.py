"""The job's Ray session: join a running cluster (an address, or RAY_ADDRESS under `ray job submit`) or start a
local one, with Ray's own chatter kept off the console."""

from __future__ import annotations

import json
import logging
import os
import socket
import time

import ray

from wxray.console import verbose
from wxray.data import location
from wxray.errors import ConfigError

JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # the submitted job's config, runtime env included (Ray's name)


def _quiet_ray() -> None:
    """Keep Ray's own chatter off the console (the job prints its progress itself); --verbose restores it."""
    for name in ("ray._private.authentication.authentication_token_setup", "ray.data", "ray.train",
                 "ray.tune"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _reachable(address: str, timeout_s: float) -> None:
    """ConfigError unless something listens at host:port within `timeout_s` (Ray itself retries forever)."""
    target = address.split("://", 1)[-1]
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"ray_address={address!r}: expected host:port (e.g. 10.0.0.1:6379), ray://host:port, "
                          f"auto or local")
    host = host.strip("[]") or "127.0.0.1"  # [::1]:6379
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=min(5.0, timeout_s)):
                return
        except OSError as e:
            if time.monotonic() >= deadline:
                raise ConfigError(f"ray_address={address}: no Ray cluster answers there after {timeout_s:g} s "
                                  f"({e.strerror or type(e).__name__}); start one with `ray start --head` "
                                  f"or leave ray_address empty for a local cluster") from None
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


def worker_env() -> dict[str, str]:
    """The storage settings (`location.settings_env`) the Ray workers get through the job's runtime env, so
    that every node reads URLs as the driver does; under `ray job submit`, less those the submitted runtime
    env sets itself (Ray refuses a key set twice)."""
    env = location.settings_env()
    try:
        submitted = json.loads(os.environ.get(JOB_CONFIG_ENV, "{}")).get("runtime_env") or {}
    except (ValueError, AttributeError):
        submitted = {}
    return {k: v for k, v in env.items() if k not in (submitted.get("env_vars") or {})}


def ensure_ray(address: str = "", num_cpus: int | None = None, timeout_s: float = 60.0) -> None:
    """Connect to a running cluster (address, or RAY_ADDRESS under `ray job submit`) or start a local one.

    Jobs never assume they started Ray: inside `ray job submit` the driver joins the job's cluster. An
    explicit address is probed first, so an unreachable cluster is an error after `timeout_s`, not a hang.
    Worker logs reach the console only with --verbose ($WXRAY_VERBOSE): the job's progress lines travel
    through `train.reporting.ProgressPrinter` instead.
    """
    if ray.is_initialized():
        return
    loud = verbose()
    if not loud:
        _quiet_ray()
    kwargs: dict = {"log_to_driver": loud, "configure_logging": loud}
    env = worker_env()
    if env:
        kwargs["runtime_env"] = {"env_vars": env}
    env_address = os.environ.get("RAY_ADDRESS", "")
    target = address or env_address
    if target not in ("", "auto", "local"):  # Ray's own keywords: nothing to probe
        _reachable(target, timeout_s)
    if address:
        ray.init(address=address, **kwargs)
    elif env_address:
        ray.init(**kwargs)
    else:
        # "local": a fresh cluster, never a stale or unrelated one found through /tmp/ray/ray_current_cluster.
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, **kwargs)
