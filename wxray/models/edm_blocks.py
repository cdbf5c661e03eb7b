"""Building blocks of Res-Slim-EDM (Sec. 3.1, Eq. 5): noise embedding, cross-attention, the EDM block.

    e_sigma = MLP_2(SiLU(MLP_1(ln(sigma) / 4)))                     NoiseEmbedding, (B,) -> (B, D)

    EDMBlock(x, Z_c, e_sigma), x (B, n, D) with n = L (dense) or K (routed), Z_c (B, L, D):
        (scale_a, shift_a, scale_m, shift_m) = W_film e_sigma        FiLM, (B, 1, D) each
        g = sigmoid(W_gate e_sigma)                                  sigma gate, (B, 1, D)
        x = x + SelfAttn(LN(x) (1 + scale_a) + shift_a)             Q, K, V: the n tokens of x
        x = x + g * CrossAttn(LN(x), LN_c(Z_c))                      Q: the n tokens of x; K, V: all L of Z_c
        x = x + MLP(LN(x) (1 + scale_m) + shift_m)

Invariant: FiLM and the gate are per-sample vectors broadcast over tokens, so a block is defined for any
n and, token by token, does not depend on which other tokens of x are present except through the
self-attention; the cross-attention always sees the full conditioning sequence (Sec. 3.4, asymmetric
design). W_film starts at zero (FiLM is the identity at init); W_gate too (g = 1/2 at init).

Every random draw (dropout, drop path) comes from the explicit generator passed to forward (blocks.py).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from wxray.models.blocks import MLP, Attention, Dropout, DropPath


class NoiseEmbedding(nn.Module):
    """e_sigma = Linear_2(SiLU(Linear_1(c_noise))), c_noise = ln(sigma) / 4 (EDM's c_noise); (B,) -> (B, D).

    Takes c_noise, not sigma, so the preconditioning (edm.precond) stays the one place that maps sigma
    to the network's inputs. Linear_1 maps the scalar to D SiLU units (a one-hidden-layer MLP in c_noise).
    """

    def __init__(self, dim: int):
        super().__init__()
        self.fc1 = nn.Linear(1, dim)
        self.fc2 = nn.Linear(dim, dim)

    def reset_parameters(self) -> None:
        # PyTorch's default for fan-in 1 (weights and biases U(-1, 1)) spreads the SiLU kinks over the
        # c_noise range (about -1.6 .. 1.1); the 0.02 truncated normal of the other layers would leave
        # every unit in SiLU's near-linear region.
        self.fc1.reset_parameters()
        self.fc2.reset_parameters()

    def forward(self, c_noise: Tensor) -> Tensor:
        return self.fc2(F.silu(self.fc1(c_noise.unsqueeze(-1))))


class CrossAttention(nn.Module):
    """Multi-head attention of x's n tokens (queries) to all L conditioning tokens (keys, values), via SDPA.

    x (B, n, D), cond (B, L, D) -> (B, n, D); cost O(n L D) for the scores. As in blocks.Attention, no
    dropout on the attention matrix (SDPA's dropout_p draws from the global RNG); dropout on the output.
    """

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True, dropout: float = 0.0):
        super().__init__()
        if dim % num_heads != 0:
            raise ValueError(f"embed_dim {dim} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.kv = nn.Linear(dim, 2 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.drop = Dropout(dropout)

    def forward(self, x: Tensor, cond: Tensor, generator: torch.Generator | None = None) -> Tensor:
        B, n, D = x.shape
        L = cond.shape[1]
        q = self.q(x).view(B, n, self.num_heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(cond).view(B, L, 2, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v)  # (B, heads, n, head_dim)
        return self.drop(self.proj(y.transpose(1, 2).reshape(B, n, D)), generator)


class EDMBlock(nn.Module):
    """FiLM (from e_sigma) + self-attention + sigma-gated cross-attention to Z_c + MLP; see the module doc.

    forward(x, generator=None, *, cond, emb): x (B, n, D), cond = Z_c (B, L, D), emb = e_sigma (B, D).
    SparseRouter calls it as block(h, generator=g, cond=Z_c, emb=e_sigma) with h the K routed tokens;
    cond is not a per-token kwarg there, so it reaches the middle blocks at full length.
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
        # FiLM replaces the affine part of the two modulated norms
        self.norm_attn = nn.LayerNorm(dim, elementwise_affine=False)
        self.attn = Attention(dim, num_heads, qkv_bias=qkv_bias, dropout=dropout)
        self.norm_cross = nn.LayerNorm(dim)
        self.norm_cond = nn.LayerNorm(dim)
        self.cross_attn = CrossAttention(dim, num_heads, qkv_bias=qkv_bias, dropout=dropout)
        self.norm_mlp = nn.LayerNorm(dim, elementwise_affine=False)
        self.mlp = MLP(dim, int(dim * mlp_ratio), dropout=dropout)
        self.film = nn.Linear(dim, 4 * dim)
        self.gate = nn.Linear(dim, dim)
        self.drop_path = DropPath(drop_path)
        self.zero_init()

    def zero_init(self) -> None:
        """FiLM = identity and gate = 1/2 (call again after a model-wide weight init)."""
        for lin in (self.film, self.gate):
            nn.init.zeros_(lin.weight)
            nn.init.zeros_(lin.bias)

    def forward(
        self, x: Tensor, generator: torch.Generator | None = None, *, cond: Tensor, emb: Tensor
    ) -> Tensor:
        if cond.shape[0] != x.shape[0] or cond.shape[2] != x.shape[2] or emb.shape != (x.shape[0], x.shape[2]):
            raise ValueError(
                f"EDMBlock needs cond (B, L, D) and emb (B, D) for x (B, n, D) = {tuple(x.shape)}; "
                f"got cond {tuple(cond.shape)}, emb {tuple(emb.shape)}"
            )
        scale_a, shift_a, scale_m, shift_m = self.film(emb).unsqueeze(1).chunk(4, dim=-1)
        g = torch.sigmoid(self.gate(emb)).unsqueeze(1)
        a = self.attn(self.norm_attn(x) * (1 + scale_a) + shift_a, generator)
        x = x + self.drop_path(a, generator)
        c = self.cross_attn(self.norm_cross(x), self.norm_cond(cond), generator)
        x = x + self.drop_path(g * c, generator)
        m = self.mlp(self.norm_mlp(x) * (1 + scale_m) + shift_m, generator)
        return x + self.drop_path(m, generator)
