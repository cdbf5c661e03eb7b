"""Transformer building blocks shared by every wxray model.

Every random draw (dropout masks, drop-path masks) comes from an explicit `torch.Generator` passed to
forward, so a forward pass can be replayed bit-identically: MC-dropout ensembles and common random
numbers across ensemble members depend on that. Masks are drawn with `torch.rand(generator=...)`
rather than `F.dropout`, whose draws cannot be tied to a generator.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor


def uniform(
    shape: tuple[int, ...],
    generator: torch.Generator | None,
    device: torch.device,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Uniform [0, 1) draws of `shape` from `generator`, returned on `device`.

    Drawn on the generator's own device, so a CPU generator can drive a GPU model and the draws (hence
    the forward pass) do not depend on the accelerator the model happens to run on.
    """
    draw_device = generator.device if generator is not None else device
    return torch.rand(shape, generator=generator, device=draw_device, dtype=dtype).to(device)


class Dropout(nn.Module):
    """Inverted dropout whose mask comes from an explicit generator.

    Active while `self.training`; `enable_mc_dropout` switches just these modules on in an eval model.
    """

    def __init__(self, p: float = 0.0):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = p

    def forward(self, x: Tensor, generator: torch.Generator | None = None) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = uniform(tuple(x.shape), generator, x.device) >= self.p
        return x * keep.to(x.dtype) / (1.0 - self.p)


class DropPath(nn.Module):
    """Stochastic depth: drops a whole residual branch per sample (mask shape (B, 1, ..., 1))."""

    def __init__(self, p: float = 0.0):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"drop-path rate must be in [0, 1), got {p}")
        self.p = p

    def forward(self, x: Tensor, generator: torch.Generator | None = None) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        shape = (x.shape[0],) + (1,) * (x.ndim - 1)
        keep = uniform(shape, generator, x.device) >= self.p
        return x * keep.to(x.dtype) / (1.0 - self.p)


def enable_mc_dropout(model: nn.Module) -> nn.Module:
    """Put only the Dropout/DropPath modules of an eval-mode model back in training mode (MC dropout)."""
    for m in model.modules():
        if isinstance(m, (Dropout, DropPath)):
            m.train()
    return model


class Attention(nn.Module):
    """Multi-head self-attention through `scaled_dot_product_attention`.

    No dropout on the attention matrix: SDPA's `dropout_p` draws from the global RNG and would break
    replayability; dropout is applied to the projected output instead.
    """

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True, dropout: float = 0.0):
        super().__init__()
        if dim % num_heads != 0:
            raise ValueError(f"embed_dim {dim} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.drop = Dropout(dropout)

    def _qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        B, L, D = x.shape
        qkv = self.qkv(x).view(B, L, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        return qkv[0], qkv[1], qkv[2]  # each (B, heads, L, head_dim)

    def forward(
        self, x: Tensor, generator: torch.Generator | None = None, return_attention: bool = False
    ) -> Tensor | tuple[Tensor, Tensor]:
        """y, or (y, attention received (B, L)) with `return_attention`; y is the SDPA output either way."""
        B, L, D = x.shape
        q, k, v = self._qkv(x)
        y = F.scaled_dot_product_attention(q, k, v)
        y = self.drop(self.proj(y.transpose(1, 2).reshape(B, L, D)), generator)
        if not return_attention:
            return y
        return y, self._received(q, k)

    @torch.no_grad()
    def _received(self, q: Tensor, k: Tensor) -> Tensor:
        # Materialises the (B, heads, L, L) softmax that SDPA never does: only on request, in one block.
        attn = (q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)).softmax(dim=-1)
        return attn.mean(dim=(1, 2))

    def attention_received(self, x: Tensor) -> Tensor:
        """(B, L): attention each key token receives, averaged over heads and queries.

        A standalone probe. Under FSDP2 parameters are only unsharded inside forward, so the router asks
        for the same quantity through `forward(..., return_attention=True)` instead.
        """
        with torch.no_grad():
            return self._received(*self._qkv(x)[:2])


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int, dropout: float = 0.0):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.drop = Dropout(dropout)

    def forward(self, x: Tensor, generator: torch.Generator | None = None) -> Tensor:
        x = self.drop(F.gelu(self.fc1(x)), generator)
        return self.drop(self.fc2(x), generator)


class Block(nn.Module):
    """Pre-norm transformer block (Eq. 11): h += attn(LN(h)); h += mlp(LN(h)).

    Works on any sequence length, which is what lets SparseRouter run it on the K routed tokens.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        dropout: float = 0.0,
        drop_path: float = 0.0,
        qkv_bias: bool = True,
    ):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, num_heads, qkv_bias=qkv_bias, dropout=dropout)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = MLP(dim, int(dim * mlp_ratio), dropout=dropout)
        self.drop_path = DropPath(drop_path)

    def forward(
        self, x: Tensor, generator: torch.Generator | None = None, return_attention: bool = False
    ) -> Tensor | tuple[Tensor, Tensor]:
        """x, or (x, attention received (B, L) in this block's self-attention) with `return_attention`.

        The attention comes out of forward, not a separate call, so it is computed while FSDP2 has this
        block's parameters unsharded; the block output is the same either way.
        """
        a = self.attn(self.norm1(x), generator, return_attention=return_attention)
        received = None
        if return_attention:
            a, received = a
        x = x + self.drop_path(a, generator)
        x = x + self.drop_path(self.mlp(self.norm2(x), generator), generator)
        return x if received is None else (x, received)

    def attention_received(self, x: Tensor) -> Tensor:
        """Attention received per token in this block's self-attention, for `x` the block input."""
        return self.attn.attention_received(self.norm1(x))
