"""Pure-PyTorch models: Res-Slim-ViT with Sparse-Reslim routing, baselines, losses.

model = build_model("reslim", n_vars=5, history=2, n_const=1, n_out=5, img_size=(32, 64),
                    patch_size=2, embed_dim=256, depth=12, num_heads=4, keep_ratio=0.25)
y = model(x, generator=torch.Generator().manual_seed(0))

Generative (GENERATIVE_MODEL_NAMES): build_model("edm", <same kwargs>, sigma_data=1.0) -> ResSlimEDM, a denoiser
called as model(y_noisy, sigma, cond, generator=g, routing=None); train with edm_loss, sample with
sample_heun / sample_stochastic, or call EDMForecaster(denoiser)(x, generator=g) as a forecaster
(wxray.models.edm, wxray.models.edm_sampler).
"""

from __future__ import annotations

from wxray.models.backbone import (
    CNNSkip,
    ResSlimBackbone,
    Tokenizer,
    VariableAggregation,
    default_split,
    sincos_pos_embed_2d,
)
from wxray.models.blocks import MLP, Attention, Block, Dropout, DropPath, RowGenerators, enable_mc_dropout
from wxray.models.e2e import DecoderConfig, EncoderConfig, ObsEncoder, StationDecoder
from wxray.models.edm import (
    ConditionTokenizer,
    HeldRandomSelector,
    HeldRouting,
    ResSlimEDM,
    edm_loss,
    loss_weight,
    precond,
)
from wxray.models.edm_blocks import CrossAttention, EDMBlock, NoiseEmbedding
from wxray.models.edm_sampler import SAMPLERS, EDMForecaster, karras_sigmas, sample_heun, sample_stochastic
from wxray.models.embeddings import EMBEDDINGS, Embedding, StreamInput
from wxray.models.film import FiLMConditioning, FiLMLayerNorm, condition_layernorms
from wxray.models.losses import (
    fair_crps,
    fair_crps_loss,
    lat_weighted_mse,
    lat_weighted_mse_per_var,
    latitude_weights,
    per_patch_error,
    selector_loss,
)
from wxray.models.registry import (
    GENERATIVE_MODEL_NAMES,
    MODEL_NAMES,
    MODELS,
    ModelConfig,
    SamplerConfig,
    as_forecaster,
    build_forecaster,
    build_model,
    model_identity,
)
from wxray.models.reslim import ResSlimViT
from wxray.models.routing import SparseRouter
from wxray.models.selectors import (
    SELECTIONS,
    ActivationNormSelector,
    AttentionSelector,
    GradientSelector,
    LaplacianSelector,
    LearnedSelector,
    RandomSelector,
    RoutingContext,
    TokenSelector,
    make_selector,
)
from wxray.models.setconv import SetConv, grid_spacing_deg
from wxray.models.sprint import SprintRouter, SprintViT
from wxray.models.stochastic import (
    NOISE_MODES,
    StochasticEncoder,
    mc_dropout,
    set_dropout,
    split_members,
    tile_members,
)

__all__ = [
    "EMBEDDINGS",
    "GENERATIVE_MODEL_NAMES",
    "MLP",
    "MODELS",
    "MODEL_NAMES",
    "ModelConfig",
    "SamplerConfig",
    "NOISE_MODES",
    "SAMPLERS",
    "SELECTIONS",
    "ActivationNormSelector",
    "Attention",
    "AttentionSelector",
    "Block",
    "CNNSkip",
    "ConditionTokenizer",
    "CrossAttention",
    "DecoderConfig",
    "DropPath",
    "Dropout",
    "EDMBlock",
    "EDMForecaster",
    "Embedding",
    "FiLMConditioning",
    "FiLMLayerNorm",
    "GradientSelector",
    "HeldRandomSelector",
    "HeldRouting",
    "LaplacianSelector",
    "LearnedSelector",
    "NoiseEmbedding",
    "EncoderConfig",
    "ObsEncoder",
    "RandomSelector",
    "ResSlimBackbone",
    "ResSlimEDM",
    "ResSlimViT",
    "RoutingContext",
    "RowGenerators",
    "SetConv",
    "SparseRouter",
    "SprintRouter",
    "SprintViT",
    "StationDecoder",
    "StochasticEncoder",
    "StreamInput",
    "TokenSelector",
    "Tokenizer",
    "VariableAggregation",
    "as_forecaster",
    "build_forecaster",
    "build_model",
    "model_identity",
    "condition_layernorms",
    "default_split",
    "edm_loss",
    "enable_mc_dropout",
    "fair_crps",
    "fair_crps_loss",
    "grid_spacing_deg",
    "karras_sigmas",
    "lat_weighted_mse",
    "lat_weighted_mse_per_var",
    "latitude_weights",
    "loss_weight",
    "make_selector",
    "mc_dropout",
    "per_patch_error",
    "precond",
    "sample_heun",
    "sample_stochastic",
    "selector_loss",
    "set_dropout",
    "sincos_pos_embed_2d",
    "split_members",
    "tile_members",
]
