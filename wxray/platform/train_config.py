"""The typed config of `jobs/train_sparse.py`: every training knob is a config key (Tune sweeps them)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from wxray.errors import ConfigError
from wxray.job import JobConfig
from wxray.platform.accelerators import Precision, ScalingCfg
from wxray.platform.datasets import DataConfig

Selection = Literal["random", "topk_attention", "learned", "learned_st", "laplacian", "gradient", "activation_norm"]


@dataclass
class ModelConfig:
    name: Literal["reslim", "droppath", "sprint", "climax"] = "reslim"
    patch_size: int = 2
    embed_dim: int = 128
    depth: int = 8
    num_heads: int = 4
    mlp_ratio: float = 4.0
    split: tuple[int, int, int] = (2, 4, 2)
    keep_ratio: float = 0.25
    selection: Selection = "random"
    deterministic_eval: bool = False
    drop_path: float = 0.0  # stochastic depth; name=droppath needs > 0 (0.1 is the baseline's usual value)
    dropout: float = 0.0
    skip_channels: int = 64
    pos_embed: Literal["learned", "fixed"] = "learned"  # learned: L x D table initialised to sin-cos
    # BCE weight of selection=learned's difficulty head. Its gradient reaches the head alone, so under AdamW
    # the weight hardly changes the head's steps; kept small so it takes little of the grad-clip norm.
    selector_loss_weight: float = 0.01

    def validate(self) -> None:
        if not 0.0 < self.keep_ratio <= 1.0:
            raise ConfigError(f"model.keep_ratio must be in (0, 1], got {self.keep_ratio}")
        if sum(self.split) != self.depth or min(self.split) < 0:
            raise ConfigError(f"model.split {list(self.split)} must be >= 0 and sum to model.depth={self.depth}")
        if self.embed_dim % self.num_heads:
            raise ConfigError(f"model.embed_dim={self.embed_dim} is not divisible by model.num_heads={self.num_heads}")
        if self.patch_size < 1:
            raise ConfigError(f"model.patch_size must be >= 1, got {self.patch_size}")
        if self.name == "droppath" and self.keep_ratio != 1.0:
            raise ConfigError("model.name=droppath is the dense stochastic-depth baseline: set model.keep_ratio=1")
        if not 0.0 <= self.drop_path < 1.0 or not 0.0 <= self.dropout < 1.0:
            raise ConfigError("model.drop_path and model.dropout must be in [0, 1)")
        if self.name == "droppath" and self.drop_path == 0.0:
            raise ConfigError("model.name=droppath needs model.drop_path > 0 (e.g. 0.1)")
        if not math.isfinite(self.selector_loss_weight) or self.selector_loss_weight < 0:
            raise ConfigError(f"model.selector_loss_weight must be finite and >= 0, got {self.selector_loss_weight}")
        if self.selection in ("topk_attention", "activation_norm") and self.split[0] == 0 and self.keep_ratio < 1:
            raise ConfigError(f"model.selection={self.selection} scores a dense-early block: needs model.split[0] >= 1")


@dataclass
class OptimConfig:
    lr: float = 1e-3
    weight_decay: float = 0.05
    betas: tuple[float, float] = (0.9, 0.95)
    warmup_steps: int = 20
    min_lr_ratio: float = 0.05
    grad_clip: float = 1.0  # 0 disables clipping

    def validate(self) -> None:
        if not math.isfinite(self.lr) or self.lr <= 0:
            raise ConfigError(f"optim.lr must be a finite number > 0, got {self.lr}")
        if self.warmup_steps < 0 or self.grad_clip < 0 or not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError("optim.warmup_steps and optim.grad_clip must be >= 0, optim.min_lr_ratio in [0, 1]")


@dataclass
class LoopConfig:
    epochs: int = 6
    max_steps_per_epoch: int = 0  # 0 = the whole shard
    checkpoint_every: int = 1  # epochs
    keep_checkpoints: int = 2
    precision: Precision = "auto"
    activation_checkpointing: bool = False
    compile: bool = False
    fsdp: bool = True  # FSDP2 fully_shard per block when num_workers > 1
    seed: int = 0
    max_failures: int = 1
    log_every: int = 10  # steps
    rollout_steps: int = 4
    routing_members: int = 1  # post-training rollout: routing draws per init; > 1 writes a `member` dim
    var_weights: dict[str, float] = field(default_factory=dict)  # channel name -> loss weight
    init_from: str = ""  # checkpoint dir/file to initialise weights from (fine-tuning)
    # Fault drill: worker rank 1 (or 0 with one worker) kills its own process once, after the first step
    # of this epoch, to exercise FailureConfig + resume. -1 = off.
    fault_drill_epoch: int = -1

    def validate(self) -> None:
        if self.epochs < 1:
            raise ConfigError(f"train.epochs must be >= 1, got {self.epochs}")
        if self.checkpoint_every < 1:
            raise ConfigError(f"train.checkpoint_every must be >= 1, got {self.checkpoint_every}")
        if self.rollout_steps < 0:
            raise ConfigError(f"train.rollout_steps must be >= 0, got {self.rollout_steps}")
        if self.routing_members < 1:
            raise ConfigError(f"train.routing_members must be >= 1, got {self.routing_members}")
        for key in ("log_every", "keep_checkpoints"):
            if getattr(self, key) < 1:
                raise ConfigError(f"train.{key} must be >= 1, got {getattr(self, key)}")
        if self.max_steps_per_epoch < 0 or self.max_failures < 0:
            raise ConfigError("train.max_steps_per_epoch and train.max_failures must be >= 0")


@dataclass
class TrainSparseConfig(JobConfig):
    data: DataConfig = field(default_factory=lambda: DataConfig(history=2, lead_steps=1, batch_size=8))
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: LoopConfig = field(default_factory=LoopConfig)
    scaling: ScalingCfg = field(default_factory=ScalingCfg)
    ray_address: str = ""  # "" = RAY_ADDRESS (ray job submit) or a local cluster
    # JobConfig: out_dir "" = runs/train_sparse/<run_name or UTC timestamp>; the same run_name again resumes.

    def validate(self) -> None:
        if self.run_name and not self.out_dir:
            self.out_dir = f"runs/train_sparse/{self.run_name}"
