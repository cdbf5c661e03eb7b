"""Checks a sweep makes before any trial starts: what a trial needs and how many fit, and whether the
trials report the metric the sweep optimises (`sweep.py` uses them)."""

from __future__ import annotations

import math

import ray

from wxray.console import say
from wxray.data.window_data import prepare_windows
from wxray.errors import ConfigError
from wxray.platform.train.tasks import VAL_RMSE
from wxray.tune import calibration
from wxray.tune.config import SweepConfig

TRIAL_CPUS = 0.05  # the trial actor only drives its Train run ({"CPU": 0} is refused by Tune)


def trial_resources(cfg) -> dict[str, float]:
    """What Tune reserves for the trial actor: a sliver for a training driver, a CPU for an inference trial
    (it forecasts in the actor itself)."""
    return {"CPU": TRIAL_CPUS if hasattr(cfg, "scaling") else 1.0}


def _per_trial_resources(cfg) -> dict[str, float]:
    if not hasattr(cfg, "scaling"):
        return trial_resources(cfg)
    s = cfg.scaling
    # an elastic trial may grow to its maximum: concurrent trials are planned for that
    need = {"CPU": s.max_workers * s.cpus_per_worker + cfg.data.read_cpus + TRIAL_CPUS}
    if s.use_gpu:
        need["GPU"] = float(s.max_workers * s.gpus_per_worker)
    return need


def concurrency(cfg: SweepConfig, trial_cfgs: list, tracking_uri: str) -> int:
    """How many trials run at once: what the cluster holds of the largest trial, capped by the config and
    by a sqlite tracking store (one writer). ConfigError when not even one trial fits."""
    total = ray.cluster_resources()
    need: dict[str, float] = {}
    for tc in trial_cfgs:
        for k, v in _per_trial_resources(tc).items():
            need[k] = max(need.get(k, 0.0), v)
    fits = min(math.floor(total.get(k, 0.0) / v + 1e-9) for k, v in need.items())
    if fits < 1:
        have = ", ".join(f"{k} {total.get(k, 0):g}" for k in need)
        raise ConfigError("per-trial resources " + ", ".join(f"{k} {v:g}" for k, v in need.items())
                          + f" (scaling.* + data.read_cpus + {TRIAL_CPUS} for the trial) exceed the cluster's "
                          f"({have})")
    n = min(fits, cfg.max_concurrent_trials or fits)
    if n > 1 and tracking_uri.startswith("sqlite:"):
        say(f"tracking on sqlite takes one writer at a time: trials run one after another (the cluster holds {n}); "
            "use an MLflow server (tracking.uri=http://host:5000) to run them side by side")
        n = 1
    return n


def reported_metrics(trial_cfg) -> tuple[set[str], set[str]]:
    """(metrics every epoch report of a trial with this config carries, those only its last one carries):
    ASHA needs the first kind; an EDM's sampled validation RMSE is of the second."""
    data = prepare_windows(trial_cfg.data)
    every = {"train/epoch_loss", "train/epoch_samples_per_s_per_worker", "epoch"}
    final: set[str] = set()
    if len(data.anchors["val"]):
        every.add("val/loss")
        rmse = {VAL_RMSE + c.name for c in data.spec.targets}
        if trial_cfg.model.generative:
            final |= rmse
        else:
            every |= rmse
    return every, final


def check_metric(cfg: SweepConfig, trial_cfgs: list) -> None:
    """`cfg.metric` is one the trials report (and, for inference trials, what they forecast with loads).
    trial_cfgs: the base config, then one config per searched value."""
    trial_cfg = trial_cfgs[0]
    if cfg.job == "forecast_e2e":
        if cfg.scheduler != "fifo":
            raise ConfigError("config key 'scheduler': a forecast_e2e trial reports once; use scheduler=fifo")
        for variant in trial_cfgs[1:]:  # the base alone need not be a trial (e.g. no dropout until swept)
            known = calibration.check_trial(variant)
            if cfg.metric not in known:
                raise ConfigError(f"config key 'metric': no forecast_e2e trial reports {cfg.metric!r} (they "
                                  f"report: {', '.join(sorted(known))})")
        return
    every, final = reported_metrics(trial_cfg)
    if cfg.metric in final and cfg.scheduler == "asha":
        raise ConfigError(f"config key 'metric': {cfg.metric!r} is reported at the last epoch only "
                          "(model.name=edm samples it then): use scheduler=fifo, or metric=val/loss with asha")
    if cfg.metric not in every | final:
        raise ConfigError(f"config key 'metric': no trial reports {cfg.metric!r} (every epoch reports: "
                          f"{', '.join(sorted(every))})")
