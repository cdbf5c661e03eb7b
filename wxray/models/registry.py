"""Models by name, with their typed config (`model.*`, `sampler.*`): a new model is its module plus one line
in `MODELS`.

    model = build_forecaster(cfg, spec)    # spec: what the model is built for (data.windows.WindowSpec is one)
    forecaster = as_forecaster(model, cfg, sampler)   # forecaster(x, generator=g) -> next state, any model
    identity = model_identity(cfg, spec)   # what a checkpoint must agree on to be loaded into this model

A forecaster is called model(x, generator=g) -> y; a generative model (an entry with `generative=True`) is a
denoiser, model(y_noisy, sigma, cond, generator=g, routing=None), wrapped with its sampler by `as_forecaster`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Protocol

from torch import nn

from wxray.config import AnyFloat, NonNegFloat, NonNegInt, PosFloat, PosInt, Probability, Range, to_dict
from wxray.errors import ConfigError
from wxray.models.edm import ResSlimEDM
from wxray.models.edm_sampler import DEFAULT_STEPS, SAMPLERS, EDMForecaster
from wxray.models.reslim import ResSlimViT
from wxray.models.selectors import SELECTIONS
from wxray.models.sprint import SprintViT


def _droppath(**kwargs: Any) -> nn.Module:
    if kwargs.get("keep_ratio", 1.0) != 1.0:
        raise ValueError(f"droppath is a dense baseline; keep_ratio must be 1.0, got {kwargs['keep_ratio']}")
    if not kwargs.get("drop_path", 0.0) > 0.0:
        raise ValueError("droppath needs drop_path > 0 (e.g. 0.1); with 0 it is the plain dense model")
    return ResSlimViT(**{**kwargs, "keep_ratio": 1.0})


def _climax(**kwargs: Any) -> nn.Module:
    if kwargs.get("cnn_skip", False):
        raise ValueError("climax has no CNN skip path; drop cnn_skip=True or use 'reslim'")
    kwargs.pop("skip_channels", None)
    return ResSlimViT(**{**kwargs, "cnn_skip": False})


@dataclass(frozen=True)
class ModelEntry:
    build: Callable[..., nn.Module]  # ResSlimViT's constructor arguments (+ sigma_data, local_condition if generative)
    generative: bool = False  # a denoiser, sampled by EDMForecaster
    doc: str = ""


MODELS: dict[str, ModelEntry] = {
    "reslim": ModelEntry(ResSlimViT, doc="ResSlimViT (dense when keep_ratio == 1)"),
    "droppath": ModelEntry(_droppath, doc="dense ResSlimViT with stochastic depth; needs drop_path > 0, keep_ratio 1"),
    "sprint": ModelEntry(SprintViT, doc="Sprint-style sparse stage (mask token + linear fusion) on the same backbone"),
    "climax": ModelEntry(_climax, doc="pure ViT, same tokenizer and blocks, no CNN skip (appendix B.1)"),
    "edm": ModelEntry(ResSlimEDM, generative=True, doc="ResSlimEDM, the generative denoiser"),
}
MODEL_NAMES = tuple(n for n, e in MODELS.items() if not e.generative)  # forecasters: model(x, generator=g) -> y
GENERATIVE_MODEL_NAMES = tuple(n for n, e in MODELS.items() if e.generative)
Name = Literal[tuple(MODELS)]  # type: ignore[valid-type]  # the registry's names, as config keys check them
Selection = Literal[SELECTIONS]  # type: ignore[valid-type]


def build_model(name: str, **kwargs: Any) -> nn.Module:
    """The model registered as `name`; kwargs are ResSlimViT's constructor arguments (see `MODELS`)."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; expected one of {', '.join(MODELS)}")
    return MODELS[name].build(**kwargs)


@dataclass
class ModelConfig:
    # droppath/sprint/climax: baselines; edm: the generative Res-Slim-EDM (trained on the EDM loss, sampled)
    name: Name = "reslim"
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
        return MODELS[self.name].generative

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
            raise ConfigError(f"model.name={self.name} holds one random selection across the denoising steps: "
                              f"model.selection must be random, got {self.selection}")
        if self.selection in ("topk_attention", "activation_norm") and self.split[0] == 0 and self.keep_ratio < 1:
            raise ConfigError(f"model.selection={self.selection} scores a dense-early block: needs model.split[0] >= 1")


@dataclass
class SamplerConfig:
    """How a generative model draws a forecast (Karras et al. 2022): heun = Algorithm 1 (deterministic ODE
    steps from a random start), stochastic = Algorithm 2 (adds churn). Unused by the other models."""

    kind: Literal[SAMPLERS] = "heun"  # type: ignore[valid-type]  # heun: Algorithm 1; stochastic: Algorithm 2 (churn)
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


class Shape(Protocol):
    """What a model is built for: its channels, history and grid (`data.windows.WindowSpec` is one)."""

    inputs: Sequence[Any]  # channels with a .name
    targets: Sequence[Any]
    constants: Sequence[str]
    history: int
    grid: tuple[int, int]
    periodic_longitude: bool


def build_forecaster(cfg: ModelConfig, spec: Shape) -> nn.Module:
    """The model of `cfg` for the channels and grid of `spec` (ValueError when it cannot be built there)."""
    kwargs = dict(n_vars=len(spec.inputs), history=spec.history, n_const=len(spec.constants),
                  n_out=len(spec.targets), img_size=spec.grid, patch_size=cfg.patch_size,
                  embed_dim=cfg.embed_dim, depth=cfg.depth, num_heads=cfg.num_heads, mlp_ratio=cfg.mlp_ratio,
                  split=tuple(cfg.split), keep_ratio=cfg.keep_ratio, selection=cfg.selection,
                  deterministic_eval=cfg.deterministic_eval, drop_path=cfg.drop_path, dropout=cfg.dropout,
                  pos_embed=cfg.pos_embed, periodic_longitude=spec.periodic_longitude,
                  skip_channels=cfg.skip_channels)
    if cfg.generative:
        kwargs.update(sigma_data=cfg.sigma_data, local_condition=cfg.local_condition)
    return build_model(cfg.name, **kwargs)


def as_forecaster(model: nn.Module, cfg: ModelConfig, sampler: SamplerConfig) -> nn.Module:
    """`model` called as forecaster(x, generator=g) -> next state: a generative denoiser (DDP-unwrapped)
    wrapped with its sampler, any other model as it is."""
    if not cfg.generative:
        return model
    return EDMForecaster(getattr(model, "module", model), **sampler.kwargs())


def channel_signature(spec: Shape) -> list[str]:
    """A spec's channels as a checkpoint records them (meta.json `model.channels`): inputs, "->", targets,
    "const:", constants."""
    return ([c.name for c in spec.inputs] + ["->"] + [c.name for c in spec.targets] + ["const:"]
            + list(spec.constants))


def model_identity(cfg: ModelConfig, spec: Shape) -> dict[str, Any]:
    """What a checkpoint must agree on to be loaded into this run's model: its config and channels."""
    return {**to_dict(cfg), "channels": channel_signature(spec)}
