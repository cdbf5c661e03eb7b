"""Conditional LayerNorm for warm starts (FiLM on top of a pretrained LayerNorm's own affine).

    out = LN(x) * (1 + scale(c)) + shift(c)          LN: the pretrained norm, its weight and bias kept
    scale, shift: Linear(cond_dim, D), weights and biases zero-initialised

Invariant: at initialisation scale(c) = shift(c) = 0 exactly, so out = LN(x) * 1 + 0 is the pretrained
LayerNorm's output bit for bit, for any c: a warm-started model starts exactly at the deterministic one.

Conditioning: every FiLMLayerNorm made by `condition_layernorms(module, cond_dim)` reads the one tensor
held by the FiLMConditioning it returns. Its owner sets `conditioning.value = c` before each forward, c
(B, L, cond_dim) per token or (B, 1, cond_dim) per sample, broadcast against the norm's input (B, L, D). The
value stays set after forward on purpose: activation checkpointing recomputes blocks during backward and
must see the same c. A norm called while the value is None raises.

A FiLMLayerNorm is an nn.LayerNorm that reuses the pretrained norm's Parameter objects, so state-dict keys
of the pretrained weights do not move (`...norm1.weight`); only `...norm1.scale.*` / `...norm1.shift.*` are
new, and a deterministic checkpoint loads into a conditioned model with strict=False.
"""

from __future__ import annotations

import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor


class FiLMConditioning:
    """The conditioning tensor shared by a module's FiLM norms; set `value` before every forward.

    Copies and pickles of a model start with value None (one shared holder per copy): the value of the last
    forward is a graph tensor, which neither deepcopy (EMA weights, checkpoints) nor pickle could take.
    """

    def __init__(self) -> None:
        self.value: Tensor | None = None

    def __deepcopy__(self, memo: dict) -> FiLMConditioning:
        return FiLMConditioning()

    def __getstate__(self) -> dict:
        return {"value": None}


class FiLMLayerNorm(nn.LayerNorm):
    """LN(x) * (1 + scale(c)) + shift(c) around the parameters of a pretrained `norm`; c from `conditioning`."""

    def __init__(self, norm: nn.LayerNorm, cond_dim: int, conditioning: FiLMConditioning):
        if len(norm.normalized_shape) != 1:
            raise ValueError(f"FiLM needs a LayerNorm over one (last) dim, got shape {tuple(norm.normalized_shape)}")
        if cond_dim < 1:
            raise ValueError(f"cond_dim must be >= 1, got {cond_dim}")
        dim = norm.normalized_shape[0]
        super().__init__(dim, eps=norm.eps, elementwise_affine=False)
        self.elementwise_affine = norm.elementwise_affine
        self.weight, self.bias = norm.weight, norm.bias  # the pretrained Parameters themselves (or None)
        self.conditioning = conditioning
        like = {} if norm.weight is None else {"device": norm.weight.device, "dtype": norm.weight.dtype}
        self.scale = nn.Linear(cond_dim, dim, **like)
        self.shift = nn.Linear(cond_dim, dim, **like)
        for lin in (self.scale, self.shift):
            nn.init.zeros_(lin.weight)
            nn.init.zeros_(lin.bias)

    def forward(self, x: Tensor) -> Tensor:
        c = self.conditioning.value
        if c is None:
            raise ValueError("FiLMLayerNorm called without conditioning: set conditioning.value before forward")
        if c.ndim != x.ndim or c.shape[0] != x.shape[0] or c.shape[1] not in (1, x.shape[1]):
            raise ValueError(
                f"FiLM conditioning {tuple(c.shape)} does not match tokens {tuple(x.shape)}: need (B, L or 1, C) "
                "(sparse routing, which hands the blocks K < L tokens, is not supported with per-token conditioning)"
            )
        y = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return y * (1 + self.scale(c)) + self.shift(c)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, cond_dim={self.scale.in_features}"


def condition_layernorms(module: nn.Module, cond_dim: int) -> FiLMConditioning:
    """Replace every nn.LayerNorm inside `module` (in place) by a FiLMLayerNorm; returns their shared conditioning.

    On a ResSlimViT that is every block's norm1 / norm2 and the final norm before the head. Raises ValueError
    when `module` has no LayerNorm or is already FiLM-conditioned.
    """
    if any(isinstance(m, FiLMLayerNorm) for m in module.modules()):
        raise ValueError(f"{type(module).__name__} is already FiLM-conditioned")
    targets = [
        (parent, name, child)
        for parent in module.modules()
        for name, child in parent.named_children()
        if isinstance(child, nn.LayerNorm)
    ]
    if not targets:
        raise ValueError(f"noise=film needs LayerNorms to condition, but {type(module).__name__} has none")
    conditioning = FiLMConditioning()
    for parent, name, norm in targets:
        setattr(parent, name, FiLMLayerNorm(norm, cond_dim, conditioning))
    return conditioning
