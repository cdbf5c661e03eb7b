"""Blocks: replayable dropout / drop path, MC dropout switch, pre-norm structure, attention received."""

import math

import pytest
import torch

from wxray.models import Attention, Block, Dropout, DropPath, enable_mc_dropout


def gen(seed):
    return torch.Generator().manual_seed(seed)


def test_dropout_mask_replays_from_generator_and_scales_kept_entries():
    drop = Dropout(0.5).train()
    x = torch.ones(4, 64, 8)
    a, b, c = drop(x, gen(1)), drop(x, gen(1)), drop(x, gen(2))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    # inverted dropout: kept entries are scaled by 1 / (1 - p), the rest are zero
    assert set(a.unique().tolist()) == {0.0, 2.0}
    assert 0.4 < (a == 0).float().mean().item() < 0.6
    assert torch.equal(drop.eval()(x, gen(1)), x)


def test_drop_path_drops_whole_samples():
    dp = DropPath(0.5).train()
    x = torch.randn(64, 10, 8)
    y = dp(x, gen(0))
    dropped = (y == 0).flatten(1).all(dim=1)
    kept = torch.isclose(y, 2 * x).flatten(1).all(dim=1)
    assert torch.all(dropped | kept)  # each sample is either fully dropped or fully kept
    assert 10 < dropped.sum().item() < 54
    assert torch.equal(dp(x, gen(0)), y)


def test_enable_mc_dropout_turns_on_only_dropout_in_eval_model():
    torch.manual_seed(0)
    block = Block(32, 4, dropout=0.2, drop_path=0.1).eval()
    x = torch.randn(2, 10, 32)
    assert torch.equal(block(x, gen(0)), block(x, gen(1)))  # eval: no randomness
    enable_mc_dropout(block)
    assert not block.training and not block.norm1.training
    assert block.attn.drop.training and block.drop_path.training
    a, b = block(x, gen(0)), block(x, gen(1))
    assert not torch.equal(a, b)
    assert torch.equal(a, block(x, gen(0)))  # each MC member replays from its generator


def test_block_is_pre_norm_residual():
    # With the attention and MLP output projections zeroed, a pre-norm block is the identity;
    # a post-norm block (LN after the residual add) would not be.
    torch.manual_seed(0)
    block = Block(32, 4)
    for lin in (block.attn.proj, block.mlp.fc2):
        torch.nn.init.zeros_(lin.weight)
        torch.nn.init.zeros_(lin.bias)
    x = 3 * torch.randn(2, 7, 32) + 1
    assert torch.equal(block(x), x)


def test_attention_received_matches_explicit_softmax_and_uniform_case():
    torch.manual_seed(0)
    attn = Attention(32, 4)
    x = torch.randn(2, 12, 32)
    received = attn.attention_received(x)
    assert received.shape == (2, 12)
    # columns of a row-stochastic matrix averaged over rows sum to 1
    torch.testing.assert_close(received.sum(dim=1), torch.ones(2))
    # the same softmax, used to mix V, reproduces the SDPA forward (so the scale matches)
    q, k, v = attn._qkv(x)
    a = (q @ k.transpose(-2, -1) / math.sqrt(attn.head_dim)).softmax(-1)
    manual = attn.proj((a @ v).transpose(1, 2).reshape(2, 12, 32))
    torch.testing.assert_close(attn(x), manual, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(received, a.mean(dim=(1, 2)))
    # zero queries -> uniform attention -> every token receives 1/L
    torch.nn.init.zeros_(attn.qkv.weight)
    torch.nn.init.zeros_(attn.qkv.bias)
    torch.testing.assert_close(attn.attention_received(x), torch.full((2, 12), 1 / 12))


def test_block_returns_attention_received_from_its_forward_with_the_same_output():
    torch.manual_seed(0)
    block = Block(32, 4, dropout=0.2, drop_path=0.1).train()
    x = torch.randn(2, 12, 32)
    y, received = block(x, gen(0), return_attention=True)
    assert torch.equal(y, block(x, gen(0)))  # the SDPA output, same draws: asking costs nothing in accuracy
    torch.testing.assert_close(received, block.attention_received(x))
    assert not received.requires_grad


def test_bad_rates_raise():
    with pytest.raises(ValueError, match="dropout"):
        Dropout(1.0)
    with pytest.raises(ValueError, match="drop-path"):
        DropPath(-0.1)
    with pytest.raises(ValueError, match="divisible"):
        Attention(30, 4)
