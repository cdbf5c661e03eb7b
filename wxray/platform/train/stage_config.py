"""The typed config of `jobs/train_e2e.py`: observations -> encoder -> processor -> decoder, stage by stage.

Stages (`stage=`), each a Ray Train run in `runs/train_e2e/<run_name>/<stage>`:

    encoder    observations of the assimilation window -> analysis z0, against the true state at t
    processor  true state at t -> state at t+1 (the Res-Slim-ViT forecaster as `jobs/train_sparse.py` trains it)
    decoder    true state at t -> station observations at t
    chain      encoder + processor finetuned end to end at lead 1 (starts from the encoder and processor stages)

A later stage finds the earlier ones by `run_name`; running a stage again with the same name resumes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from wxray.config import NonNegFloat, PosFloat, RunsDir
from wxray.data import location
from wxray.errors import ConfigError
from wxray.forecast.stages import STAGES, StageModels
from wxray.job import JobConfig
from wxray.platform.cluster.scaling import ScalingCfg
from wxray.platform.train.config import LoopConfig, OptimConfig


def check_stages_folder(storage: str, stages: str) -> None:
    """Training stages find each other's checkpoints under `stages`, a folder every node sees: neither Ray
    Train's `train.storage` nor a URL (a stages folder copied to a bucket is read from there by the forecast and
    ensemble jobs, which fetch what they need)."""
    if storage:
        raise ConfigError("config key 'train.storage' is for jobs/train_sparse.py; the end-to-end stages keep "
                          "their checkpoints under stages (a folder every node sees)")
    if location.is_remote(stages):
        raise ConfigError(f"stages={stages}: the end-to-end stages are trained into a folder every node sees, not "
                          "a URL; copy the folder to a bucket afterwards to read it from there (jobs/forecast_e2e.py, "
                          "jobs/ensemble.py, jobs/ose.py)")


@dataclass
class TrainE2EConfig(StageModels, JobConfig):
    # StageModels: stage (see the module docstring), data, encoder, processor, decoder
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: LoopConfig = field(default_factory=lambda: LoopConfig(epochs=10))
    scaling: ScalingCfg = field(default_factory=ScalingCfg)
    chain_analysis_weight: NonNegFloat = 1.0  # chain: weight of the analysis error beside the lead-1 error
    stages: RunsDir = ""  # where the earlier stages are; "" = runs/train_e2e/<run_name>
    ray_address: str = ""  # Ray cluster (host:port); "" = RAY_ADDRESS (ray job submit) or a new local one
    ray_timeout_s: PosFloat = 60.0  # give up on an unreachable ray_address after this many seconds
    # JobConfig: run_name names the chain of stages ("" = "e2e"); out_dir "" = runs/train_e2e/<run_name>/<stage>.

    experiment = "wxray-e2e"
    renamed = {"stages_dir": "stages"}  # one release
    columns = ("val/loss", "train/epoch_loss", "val/rmse/*", "test/*/*")

    def run_label(self, job: str) -> str:
        return f"e2e-{self.stage}"

    def validate(self) -> None:
        if self.stage not in STAGES:
            raise ConfigError(f"stage must be one of {', '.join(STAGES)}, got {self.stage!r}")
        check_stages_folder(self.train.storage, self.stages)
        name = self.run_name or "e2e"
        if not self.stages:
            self.stages = f"runs/train_e2e/{name}"
        if not self.out_dir:
            self.out_dir = f"{self.stages}/{self.stage}"
