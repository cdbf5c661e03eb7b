"""Inference-time sweeps (`job: forecast_e2e`): a trial is one jobs/forecast_e2e.py ensemble of a trained
end-to-end chain, scored by jobs/evaluate.py against the chain's store. The paper picks the processor's
inference dropout rate p this way (configs/sweeps/dropout.yaml): the rate whose spread-skill ratio is
closest to 1.

Each trial reports once, from the evaluation's scorecard over the leads after the analysis (lead 0 has no
dropout spread), the scores the registry marks for a sweep (`verify.metrics`):

    ssr_distance   mean over channels and leads of |SSR - 1|   (the paper's criterion; min)
    mean_ssr       mean SSR                                     (`Metric.calibration`: SSR's calibrated value 1)
    crps/<channel>, rmse/<channel>    means over leads          (`Metric.sweep`: fair CRPS; ensemble-mean RMSE)

The trial's MLflow child run is the forecast's; the evaluation runs untracked in `<trial dir>/evaluate`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
from ray import tune

from wxray.forecast.chain import load_chain, load_stochastic
from wxray.forecast.job_e2e import ForecastE2EConfig, forecast_e2e
from wxray.job import JobContext
from wxray.tune.trials import run_trial
from wxray.verify import metrics
from wxray.verify.evaluate import EvaluateConfig, evaluate


def _calibrated() -> dict[str, float]:
    return {m.name: m.calibration for m in metrics.by_name().values() if m.calibration is not None}


def _swept() -> list[str]:
    return [m.name for m in sorted((m for m in metrics.by_name().values() if m.sweep), key=lambda m: m.sweep)]


def report_keys(channels: list[str]) -> set[str]:
    """The metrics a trial over these channels reports (module doc)."""
    summary = {k for name in _calibrated() for k in (f"{name}_distance", f"mean_{name}")}
    return summary | {f"{name}/{c}" for name in _swept() for c in channels}


def is_report_key(key: str) -> bool:
    """Whether `key` is one of a trial's reported metrics, whatever its channels."""
    return key in report_keys([]) or key.startswith(tuple(f"{name}/" for name in _swept()))


def check_trial(base_cfg) -> set[str]:
    """Load what every trial forecasts with (the chain; its stochastic parts when the trial draws members), so
    a missing stage is one line before any trial starts; the metrics a trial reports."""

    tcfg, data, *_ = load_chain(base_cfg.stages, base_cfg.store, base_cfg.obs_dir, base_cfg.deny)
    if base_cfg.members.M * base_cfg.members.N > 1:
        load_stochastic(Path(base_cfg.stages), tcfg, data, base_cfg.members.M, base_cfg.members.N,
                        base_cfg.dropout)
    return report_keys([c.name for c in data.spec.targets])


def scorecard_metrics(scorecard: Path) -> dict[str, float]:
    """The trial's report (module doc) from an evaluation's scorecard.csv."""
    card = pd.read_csv(scorecard)
    card = card[card["lead_hours"] > 0]
    out: dict[str, float] = {}
    for metric, calibrated in _calibrated().items():
        values = card.loc[card["metric"] == metric, "value"].astype(float)
        out[f"{metric}_distance"] = float((values - calibrated).abs().mean())
        out[f"mean_{metric}"] = float(values.mean())
    for metric in _swept():
        rows = card[card["metric"] == metric]
        out.update({f"{metric}/{ch}": float(v) for ch, v in rows.groupby("channel")["value"].mean().items()})
    return out


def forecast_trial_fn(config: dict[str, Any]) -> None:
    """One calibration trial: forecast_e2e with this trial's values (its own run directory and child MLflow
    run), then the evaluation, then one report to Tune."""
    metrics: dict[str, float] = {}

    def work(cfg, ctx):
        result = forecast_e2e(cfg, ctx)
        ev_dir = Path(cfg.out_dir) / "evaluate"
        ev = EvaluateConfig(forecast=result["forecast"], truth=result["store"], plots=False, out_dir=str(ev_dir))
        ev.tracking.enabled = False
        ev_ctx = JobContext("evaluate", ev, ev_dir, lock=False)
        try:
            evaluate(ev, ev_ctx)
        finally:
            ev_ctx.release()
        metrics.update(scorecard_metrics(ev_dir / "scorecard.csv"))
        ctx.tracker.log_metrics(metrics)
        return {**result, **metrics}

    run_trial(config, ForecastE2EConfig, "forecast_e2e", work)
    tune.report(metrics)
