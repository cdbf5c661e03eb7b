"""The typed config of `jobs/train_sparse.py`: every training knob is a config key (Tune sweeps them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from wxray.config import Fraction, InPath, NonNegFloat, NonNegInt, PosFloat, PosInt, Range, RunsDir, Seed
from wxray.data.window_data import DataConfig
from wxray.errors import ConfigError
from wxray.forecast.workers import ForecastWorkers
from wxray.job import JobConfig
from wxray.models.compiled import CompileBackend, CompileMode, compile_mode
from wxray.models.registry import ModelConfig, SamplerConfig
from wxray.platform.cluster.devices import Precision
from wxray.platform.cluster.scaling import ScalingCfg


@dataclass
class OptimConfig:
    lr: PosFloat = 1e-3  # AdamW peak learning rate (for one worker, see lr_scaling)
    lr_scaling: NonNegFloat = 0.0  # peak LR = lr x workers^lr_scaling (the paper: 0.8); 0 = no scaling
    weight_decay: NonNegFloat = 0.05  # AdamW decoupled weight decay
    betas: tuple[Fraction, Fraction] = (0.9, 0.95)  # AdamW moment decay rates
    warmup_steps: NonNegInt = 20  # linear warmup, in steps of one worker's batch (see warmup_epochs)
    warmup_epochs: NonNegFloat = 0.0  # linear warmup in epochs; > 0 replaces warmup_steps (the paper's recipe)
    min_lr_ratio: Fraction = 0.05  # cosine floor as a fraction of the peak LR
    grad_clip: NonNegFloat = 1.0  # global gradient-norm clip; 0 disables clipping


@dataclass
class LoopConfig:
    epochs: PosInt = 6  # passes over the training windows
    max_steps_per_epoch: NonNegInt = 0  # 0 = the whole shard
    checkpoint_every: PosInt = 1  # epochs between checkpoints (the last epoch always writes one)
    keep_checkpoints: PosInt = 2  # newest checkpoints kept
    precision: Precision = "auto"  # auto: bf16 on GPUs that have it, fp32 on CPU
    activation_checkpointing: bool = False  # recompute each block in backward (less memory, more time)
    # torch.compile the model: off, default, reduce-overhead (CUDA graphs of the compiled parts), max-autotune;
    # random draws stay eager between compiled graphs (models/compiled.py); true = default
    compile: CompileMode | bool = "off"
    compile_backend: CompileBackend = "inductor"  # aot_eager: traced without code generation (checks that it compiles)
    # capture the whole step (forward, backward, clip, AdamW) as one CUDA graph and replay it for every batch of
    # its shape; one line says why where it cannot be (platform/train/step_graph.py)
    cuda_graphs: bool = False
    fsdp: bool = True  # FSDP2 fully_shard per block when num_workers > 1 (else DDP)
    seed: Seed = 0  # initial weights, token selections and dropout masks
    max_failures: NonNegInt = 1  # worker failures Ray Train recovers from (restarting from the checkpoint)
    log_every: PosInt = 10  # steps between per-step MLflow metrics
    rollout_steps: NonNegInt = 4  # autoregressive steps of the rollout on the test split after training
    # post-training rollout: members per init (routing draws; for model.name=edm, samples); > 1 writes `member`
    routing_members: PosInt = 1
    var_weights: dict[str, NonNegFloat] = field(default_factory=dict)  # channel name -> loss weight
    init_from: InPath = ""  # checkpoint dir/file (or its URL) to initialise weights from (fine-tuning)
    # where checkpoints go: "" = <out_dir>/ray; a URL (s3://bucket/runs) or a shared folder: <storage>/<job>/<run>/ray,
    # with a copy of the run directory beside it (platform/train/storage.py)
    storage: RunsDir = ""
    # Fault drill: worker rank 1 (or 0 with one worker) kills its own process once, after the first step
    # of this epoch, to exercise FailureConfig + resume. -1 = off.
    fault_drill_epoch: Annotated[int, Range(-1)] = -1

    def validate(self) -> None:
        self.compile = compile_mode(self.compile)  # the older true / false as modes
        if self.cuda_graphs and self.compile in ("reduce-overhead", "max-autotune"):
            raise ConfigError(f"train.cuda_graphs captures the whole step itself: use it with train.compile=off, "
                              f"default or max-autotune-no-cudagraphs, not {self.compile} (which captures its own)")


@dataclass
class TrainSparseConfig(JobConfig):
    data: DataConfig = field(default_factory=lambda: DataConfig(history=2, lead_steps=1, batch_size=8))
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: LoopConfig = field(default_factory=LoopConfig)
    scaling: ScalingCfg = field(default_factory=ScalingCfg)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)  # model.name=edm: validation and rollout
    # the forecast after training: actors=0 on the driver, N on N Ray actors holding the final model
    forecast_workers: ForecastWorkers = field(default_factory=ForecastWorkers)
    ray_address: str = ""  # Ray cluster (host:port); "" = RAY_ADDRESS (ray job submit) or a new local one
    ray_timeout_s: PosFloat = 60.0  # give up on an unreachable ray_address after this many seconds
    # the final checkpoint is logged as the run's MLflow model (mlflow_model.py)
    registered_model: str = ""  # the registered model it becomes the next version of; "" = wxray-<model.name>
    register_model: bool = True  # false: the model is logged to the run, no version registered
    # JobConfig: out_dir "" = runs/train_sparse/<run_name or UTC timestamp>; the same run_name again resumes.

    experiment = "wxray-train"
    columns = ("val/loss", "train/epoch_loss", "train/epoch_samples_per_s_per_worker", "val/rmse/*")

    def run_label(self, job: str) -> str:
        return f"{self.model.name}-r{self.model.keep_ratio:g}"

    def validate(self) -> None:
        if self.run_name and not self.out_dir:
            self.out_dir = f"runs/train_sparse/{self.run_name}"
        m = self.model
        if self.train.routing_members > 1 and not m.generative and (
                m.selection != "random" or m.deterministic_eval or m.keep_ratio == 1):
            raise ConfigError(f"train.routing_members={self.train.routing_members} draws routing ensembles: needs "
                              f"model.selection=random, model.deterministic_eval=false and model.keep_ratio < 1")
