"""The sweep's config (`jobs/sweep.py`): what a trial runs, the space, the scheduler and the metric."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from wxray.config import InPath, NonNegInt, PosInt, Range, deep_merge
from wxray.config_yaml import load_yaml
from wxray.forecast.job_e2e import ForecastE2EConfig
from wxray.job import JobConfig
from wxray.platform.train.config import TrainSparseConfig
from wxray.tune.space import nest


@dataclass
class SweepConfig(JobConfig):
    # what a trial runs: train_sparse (a training run) or forecast_e2e (an ensemble of a trained chain,
    # evaluated: inference-time keys such as the dropout rate, tune/calibration.py)
    job: Literal["train_sparse", "forecast_e2e"] = "train_sparse"
    base: InPath = ""  # that job's config YAML every trial starts from ("" = the job's defaults)
    overrides: dict[str, Any] = field(default_factory=dict)  # dotted keys of that job set for every trial
    space: dict[str, Any] = field(default_factory=dict)  # dotted key -> {grid|choice|uniform|loguniform: ...}
    repeat: PosInt = 1  # seeds per point (train.seed 0 .. repeat - 1)
    num_samples: PosInt = 1  # draws of the choice/uniform/loguniform keys per grid point
    # what ASHA and the best config go by: val/loss, val/rmse/<channel>, train/epoch_loss (train_sparse);
    # ssr_distance, mean_ssr, crps/<channel>, rmse/<channel> (forecast_e2e: tune/calibration.report_keys)
    metric: str = "val/loss"
    mode: Literal["min", "max"] = "min"  # min: lower metric is better; max: higher
    scheduler: Literal["asha", "fifo"] = "asha"  # asha: stop poor trials early; fifo: every trial to the end
    grace_period: PosInt = 1  # ASHA: epochs every trial runs before it may be stopped
    reduction_factor: Annotated[float, Range(1, lo_open=True)] = 2.0  # ASHA: keep the top 1/this at each rung
    max_concurrent_trials: NonNegInt = 0  # 0 = as many as the cluster holds (1 with a sqlite tracking store)
    ray_address: str = ""  # Ray cluster (host:port); "" = RAY_ADDRESS (ray job submit) or a new local one
    ray_timeout_s: Annotated[float, Range(0, lo_open=True)] = 60.0  # give up on an unreachable ray_address after this

    experiment = "wxray-sweep"
    columns = ("best/*",)

    def job_config_class(self) -> type:
        return ForecastE2EConfig if self.job == "forecast_e2e" else TrainSparseConfig

    def base_dict(self) -> dict[str, Any]:
        """The nested training config of every trial before its own values (base YAML + overrides)."""
        base = load_yaml(self.base) if self.base else {}
        return deep_merge(base, nest(self.overrides))
