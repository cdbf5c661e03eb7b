"""The typed config of `jobs/train_sparse.py`: every training knob is a config key (Tune sweeps them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

from wxray.config import AnyFloat, Fraction, InPath, NonNegFloat, NonNegInt, PosFloat, PosInt, Probability, Range, Seed
from wxray.data.window_data import DataConfig
from wxray.errors import ConfigError
from wxray.job import JobConfig
from wxray.models.edm_sampler import DEFAULT_STEPS
from wxray.platform.cluster.devices import Precision
from wxray.platform.cluster.scaling import ScalingCfg

Selection = Literal["random", "topk_attention", "learned", "learned_st", "laplacian", "gradient", "activation_norm"]


@dataclass
class ModelConfig:
    # droppath/sprint/climax: baselines; edm: the generative Res-Slim-EDM (trained on the EDM loss, sampled)
    name: Literal["reslim", "droppath", "sprint", "climax", "edm"] = "reslim"
    patch_size: PosInt = 2  # pixels per token side (must divide the fitted grid, see data.grid_fit)
    embed_dim: PosInt = 128  # token width D
    depth: PosInt = 8  # transformer blocks in all
    num_heads: PosInt = 4  # attention heads (must divide embed_dim)
    mlp_ratio: PosFloat = 4.0  # MLP hidden width / embed_dim
    split: tuple[NonNegInt, NonNegInt, NonNegInt] = (2, 4, 2)  # dense-early, sparse-middle, dense-late blocks
    keep_ratio: Annotated[float, Range(0, 1, lo_open=True)] = 0.25  # fraction r of tokens the middle blocks see
    selection: Selection = "random"  # which tokens: random (the paper's) or a scored ablation
    deterministic_eval: bool = False  # eval: one fixed random selection instead of a fresh draw
    drop_path: Probability = 0.0  # stochastic depth; name=droppath needs > 0 (0.1 is the baseline's usual value)
    dropout: Probability = 0.0  # dropout rate in attention/MLP outputs
    skip_channels: PosInt = 64  # hidden channels of the CNN skip path
    pos_embed: Literal["learned", "fixed"] = "learned"  # learned: L x D table initialised to sin-cos
    # BCE weight of selection=learned's difficulty head. Its gradient reaches the head alone, so under AdamW
    # the weight hardly changes the head's steps; kept small so it takes little of the grad-clip norm.
    selector_loss_weight: NonNegFloat = 0.01
    sigma_data: PosFloat = 1.0  # edm: std of the normalised target (1 for standardised tendencies)
    p_mean: AnyFloat = -1.2  # edm: training noise levels ln sigma ~ N(p_mean, p_std^2) (EDM's image default)
    p_std: PosFloat = 1.2  # edm: see p_mean
    local_condition: bool = False  # edm: also add Z_c to the noisy target's tokens (paper: cross-attention only)

    @property
    def generative(self) -> bool:
        return self.name == "edm"

    def validate(self) -> None:
        if sum(self.split) != self.depth:
            raise ConfigError(f"model.split {list(self.split)} must sum to model.depth={self.depth}")
        if self.embed_dim % self.num_heads:
            raise ConfigError(f"model.embed_dim={self.embed_dim} is not divisible by model.num_heads={self.num_heads}")
        if self.name == "droppath" and self.keep_ratio != 1.0:
            raise ConfigError("model.name=droppath is the dense stochastic-depth baseline: set model.keep_ratio=1")
        if self.name == "droppath" and self.drop_path == 0.0:
            raise ConfigError("model.name=droppath needs model.drop_path > 0 (e.g. 0.1)")
        if self.generative and self.selection != "random":
            raise ConfigError(f"model.name=edm holds one random selection across the denoising steps: "
                              f"model.selection must be random, got {self.selection}")
        if self.selection in ("topk_attention", "activation_norm") and self.split[0] == 0 and self.keep_ratio < 1:
            raise ConfigError(f"model.selection={self.selection} scores a dense-early block: needs model.split[0] >= 1")


@dataclass
class SamplerConfig:
    """How model.name=edm draws a forecast (Karras et al. 2022): heun = Algorithm 1 (deterministic ODE
    steps from a random start), stochastic = Algorithm 2 (adds churn). Unused by the other models."""

    kind: Literal["heun", "stochastic"] = "heun"  # heun: Algorithm 1; stochastic: Algorithm 2 (churn)
    # noise levels N; 2N - 1 denoiser calls per sample. 64: the spread's discretisation bias under 1% (EDM's 18
    # widen it by 4-16%, models.edm_sampler.spread_gain)
    steps: PosInt = DEFAULT_STEPS
    sigma_min: PosFloat = 0.002  # the last noise level before 0
    sigma_max: PosFloat = 80.0  # the first noise level (the initial noise's std)
    rho: PosFloat = 7.0  # schedule curvature
    s_churn: NonNegFloat = 0.0  # stochastic only: total churn (gamma_i = min(s_churn / N, sqrt 2 - 1))
    s_min: NonNegFloat = 0.0  # stochastic only: churn where s_min <= t_i <= s_max
    s_max: PosFloat = 1e6  # EDM's default is infinity; anything above sigma_max is the same
    s_noise: PosFloat = 1.0  # stochastic only: noise inflation

    def validate(self) -> None:
        if self.sigma_min > self.sigma_max:
            raise ConfigError(f"sampler.sigma_min={self.sigma_min} must not exceed sampler.sigma_max={self.sigma_max}")

    def kwargs(self) -> dict:
        """EDMForecaster's keyword arguments."""
        return dict(sampler=self.kind, steps=self.steps, sigma_min=self.sigma_min, sigma_max=self.sigma_max,
                    rho=self.rho, s_churn=self.s_churn, s_min=self.s_min, s_max=self.s_max, s_noise=self.s_noise)


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
    compile: bool = False  # torch.compile the model
    fsdp: bool = True  # FSDP2 fully_shard per block when num_workers > 1 (else DDP)
    seed: Seed = 0  # initial weights, token selections and dropout masks
    max_failures: NonNegInt = 1  # worker failures Ray Train recovers from (restarting from the checkpoint)
    log_every: PosInt = 10  # steps between per-step MLflow metrics
    rollout_steps: NonNegInt = 4  # autoregressive steps of the rollout on the test split after training
    # post-training rollout: members per init (routing draws; for model.name=edm, samples); > 1 writes `member`
    routing_members: PosInt = 1
    var_weights: dict[str, NonNegFloat] = field(default_factory=dict)  # channel name -> loss weight
    init_from: InPath = ""  # checkpoint dir/file to initialise weights from (fine-tuning)
    # Fault drill: worker rank 1 (or 0 with one worker) kills its own process once, after the first step
    # of this epoch, to exercise FailureConfig + resume. -1 = off.
    fault_drill_epoch: Annotated[int, Range(-1)] = -1


@dataclass
class TrainSparseConfig(JobConfig):
    data: DataConfig = field(default_factory=lambda: DataConfig(history=2, lead_steps=1, batch_size=8))
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: LoopConfig = field(default_factory=LoopConfig)
    scaling: ScalingCfg = field(default_factory=ScalingCfg)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)  # model.name=edm: validation and rollout
    ray_address: str = ""  # Ray cluster (host:port); "" = RAY_ADDRESS (ray job submit) or a new local one
    ray_timeout_s: PosFloat = 60.0  # give up on an unreachable ray_address after this many seconds
    # JobConfig: out_dir "" = runs/train_sparse/<run_name or UTC timestamp>; the same run_name again resumes.

    experiment = "wxray-train"

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
