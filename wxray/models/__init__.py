"""Pure-PyTorch models: Res-Slim-ViT with Sparse-Reslim routing, baselines, losses.

model = build_model("reslim", n_vars=5, history=2, n_const=1, n_out=5, img_size=(32, 64),
                    patch_size=2, embed_dim=256, depth=12, num_heads=4, keep_ratio=0.25)
y = model(x, generator=torch.Generator().manual_seed(0))
"""

from __future__ import annotations

from typing import Any

from torch import nn

from wxray.models.blocks import MLP, Attention, Block, Dropout, DropPath, enable_mc_dropout
from wxray.models.e2e import ObsEncoder, StationDecoder, StreamInput
from wxray.models.losses import (
    fair_crps,
    lat_weighted_mse,
    lat_weighted_mse_per_var,
    latitude_weights,
    per_patch_error,
    selector_loss,
)
from wxray.models.reslim import (
    CNNSkip,
    ResSlimViT,
    Tokenizer,
    VariableAggregation,
    default_split,
    sincos_pos_embed_2d,
)
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

MODEL_NAMES = ("reslim", "droppath", "sprint", "climax")


def build_model(name: str, **kwargs: Any) -> nn.Module:
    """Model by config name; kwargs are ResSlimViT's constructor arguments.

    reslim:   ResSlimViT (dense when keep_ratio == 1)
    droppath: dense ResSlimViT regularised by stochastic depth; needs drop_path > 0 (0.1 is the usual
              baseline value) and keep_ratio 1
    sprint:   Sprint-style sparse stage (mask token + linear fusion) on the same backbone
    climax:   pure ViT, same tokenizer and blocks, no CNN skip (appendix B.1); may still be routed
    """
    if name == "reslim":
        return ResSlimViT(**kwargs)
    if name == "droppath":
        if kwargs.get("keep_ratio", 1.0) != 1.0:
            raise ValueError(
                f"droppath is a dense baseline; keep_ratio must be 1.0, got {kwargs['keep_ratio']}"
            )
        if not kwargs.get("drop_path", 0.0) > 0.0:
            raise ValueError("droppath needs drop_path > 0 (e.g. 0.1); with 0 it is the plain dense model")
        return ResSlimViT(**{**kwargs, "keep_ratio": 1.0})
    if name == "sprint":
        return SprintViT(**kwargs)
    if name == "climax":
        if kwargs.get("cnn_skip", False):
            raise ValueError("climax has no CNN skip path; drop cnn_skip=True or use 'reslim'")
        return ResSlimViT(**{**kwargs, "cnn_skip": False})
    raise ValueError(f"unknown model {name!r}; expected one of {', '.join(MODEL_NAMES)}")


__all__ = [
    "MLP",
    "MODEL_NAMES",
    "SELECTIONS",
    "ActivationNormSelector",
    "Attention",
    "AttentionSelector",
    "Block",
    "CNNSkip",
    "DropPath",
    "Dropout",
    "GradientSelector",
    "LaplacianSelector",
    "LearnedSelector",
    "ObsEncoder",
    "RandomSelector",
    "ResSlimViT",
    "RoutingContext",
    "SetConv",
    "SparseRouter",
    "SprintRouter",
    "SprintViT",
    "StationDecoder",
    "StreamInput",
    "TokenSelector",
    "Tokenizer",
    "VariableAggregation",
    "build_model",
    "default_split",
    "enable_mc_dropout",
    "fair_crps",
    "grid_spacing_deg",
    "lat_weighted_mse",
    "lat_weighted_mse_per_var",
    "latitude_weights",
    "make_selector",
    "per_patch_error",
    "selector_loss",
    "sincos_pos_embed_2d",
]
