"""Transformer building blocks shared by every wxray model.

Every random draw (dropout masks, drop-path masks) comes from an explicit `torch.Generator` passed to
forward, so a forward pass can be replayed bit-identically: MC-dropout ensembles and common random
numbers across ensemble members depend on that. Masks are drawn with `torch.rand(generator=...)`
rather than `F.dropout`, whose draws cannot be tied to a generator.

Wherever a generator is taken, a `RowGenerators` (one generator per batch row) may stand in for it: row r of
every draw then comes from generator r alone, so one member of a batched ensemble can be replayed on its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor


class RowGenerators:
    """One `torch.Generator` per batch row, usable wherever a model takes `generator=`.

        draw[r] = draw of shape[1:] from generators[r]      (r = 0 .. B - 1; B = len(self) must be shape[0])

    Every generator advances by its own row's draws only, so row r of a batched forward is the forward
    of that row alone started from generator r's state: members of an ensemble can be seeded from their
    coordinates and reproduced one at a time. `get_state` / `set_state` / `device` mirror torch.Generator's,
    which is what activation checkpointing needs to replay a block.
    """

    def __init__(self, generators: Iterable[torch.Generator]):
        self.generators = tuple(generators)
        if not self.generators or not all(isinstance(g, torch.Generator) for g in self.generators):
            raise ValueError("RowGenerators needs a non-empty sequence of torch.Generator")
        if len({str(g.device) for g in self.generators}) > 1:
            raise ValueError("RowGenerators' generators must all live on one device")

    @classmethod
    def from_seeds(cls, seeds: Iterable[int], device: str | torch.device = "cpu") -> RowGenerators:
        """One generator per seed, row r seeded with seeds[r]."""
        return cls(torch.Generator(device=device).manual_seed(int(s)) for s in seeds)

    def __len__(self) -> int:
        return len(self.generators)

    def __iter__(self) -> Iterator[torch.Generator]:
        return iter(self.generators)

    def __getitem__(self, i: int | slice) -> torch.Generator | RowGenerators:
        return RowGenerators(self.generators[i]) if isinstance(i, slice) else self.generators[i]

    @property
    def device(self) -> torch.device:
        return self.generators[0].device

    def get_state(self) -> tuple[Tensor, ...]:
        return tuple(g.get_state() for g in self.generators)

    def set_state(self, states: tuple[Tensor, ...]) -> RowGenerators:
        if len(states) != len(self.generators):
            raise ValueError(f"{len(states)} states for {len(self.generators)} row generators")
        for g, s in zip(self.generators, states, strict=True):
            g.set_state(s)
        return self


def copy_generator(generator: torch.Generator | RowGenerators) -> torch.Generator | RowGenerators:
    """A new generator (or RowGenerators) at the same state: draws from it replay the original's next draws."""
    if isinstance(generator, RowGenerators):
        return RowGenerators(copy_generator(g) for g in generator)
    fresh = torch.Generator(device=generator.device)
    fresh.set_state(generator.get_state())
    return fresh


def _draw(
    fn: Callable[..., Tensor],
    shape: tuple[int, ...],
    generator: torch.Generator | RowGenerators | None,
    device: torch.device,
    dtype: torch.dtype,
) -> Tensor:
    if isinstance(generator, RowGenerators):
        if not shape or shape[0] != len(generator):
            raise ValueError(f"{len(generator)} row generators cannot draw shape {tuple(shape)}: rows must match")
        rows = [fn(tuple(shape[1:]), generator=g, device=g.device, dtype=dtype) for g in generator]
        return torch.stack(rows).to(device)
    draw_device = generator.device if generator is not None else device
    return fn(tuple(shape), generator=generator, device=draw_device, dtype=dtype).to(device)


def uniform(
    shape: tuple[int, ...],
    generator: torch.Generator | RowGenerators | None,
    device: torch.device,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Uniform [0, 1) draws of `shape` from `generator`, returned on `device`.

    Drawn on the generator's own device, so a CPU generator can drive a GPU model and the draws (hence
    the forward pass) do not depend on the accelerator the model happens to run on.
    """
    return _draw(torch.rand, shape, generator, device, dtype)


def normal(
    shape: tuple[int, ...],
    generator: torch.Generator | RowGenerators | None,
    device: torch.device,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Standard normal draws of `shape` from `generator`, returned on `device` (drawn as `uniform` is)."""
    return _draw(torch.randn, shape, generator, device, dtype)


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
