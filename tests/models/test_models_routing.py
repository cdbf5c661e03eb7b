"""SparseRouter: dense equivalence at r=1, residual-delta exactness, selection, gradient locality."""

import math

import pytest
import torch
import torch.nn as nn

from wxray.models import SELECTIONS, RandomSelector, RoutingContext, SparseRouter, make_selector


def gen(seed):
    return torch.Generator().manual_seed(seed)


def tokens(B=2, L=40, D=32, seed=7):
    return torch.randn(B, L, D, generator=gen(seed))


def test_keep_ratio_one_is_the_plain_dense_loop_bit_for_bit(make_blocks):
    blocks = make_blocks(4, dropout=0.1, drop_path=0.1)
    router = SparseRouter(blocks, (1, 2, 1), keep_ratio=1.0).train()
    x = tokens()
    ref = x
    g = gen(3)
    for block in blocks:
        ref = block(ref, generator=g)
    out = router(x, generator=gen(3))
    assert torch.equal(out, ref)
    assert router.last_indices is None


def test_bad_split_and_keep_ratio_raise(make_blocks):
    with pytest.raises(ValueError, match=r"\(1, 2, 2\).*\(4\)"):
        SparseRouter(make_blocks(4), (1, 2, 2))
    with pytest.raises(ValueError, match="split"):
        SparseRouter(make_blocks(4), (2, 2))
    for r in (0.0, -0.5, 1.5):
        with pytest.raises(ValueError, match="keep_ratio"):
            SparseRouter(make_blocks(4), (1, 2, 1), keep_ratio=r)
    with pytest.raises(ValueError, match="unknown selection"):
        SparseRouter(make_blocks(4), (1, 2, 1), keep_ratio=0.5, selection="bogus")
    with pytest.raises(ValueError, match="dense-early"):
        SparseRouter(make_blocks(4), (0, 3, 1), keep_ratio=0.5, selection="topk_attention")
    with pytest.raises(ValueError, match="dim"):
        SparseRouter(make_blocks(4), (1, 2, 1), keep_ratio=0.5, selection="learned")
    router = SparseRouter(make_blocks(4), (1, 2, 1), keep_ratio=0.01)
    with pytest.raises(ValueError, match="no tokens"):
        router(tokens(L=40))


def test_unselected_tokens_keep_pre_routing_values_exactly(make_blocks):
    blocks = make_blocks(4)
    router = SparseRouter(blocks, (1, 3, 0), keep_ratio=0.3)
    x = tokens()
    out = router(x, generator=gen(0))
    after_early = blocks[0](x)
    idx = router.last_indices
    unselected = torch.ones(2, 40, dtype=torch.bool)
    unselected[torch.arange(2)[:, None], idx] = False
    assert unselected.sum().item() == 2 * (40 - math.floor(0.3 * 40))
    assert torch.equal(out[unselected], after_early[unselected])
    # selected tokens did change: x0 + (h - h0)
    assert not torch.allclose(out[~unselected], after_early[~unselected])


@pytest.mark.parametrize("L,r", [(40, 0.25), (37, 0.3), (128, 0.1)])
def test_random_selection_sorted_distinct_sized_and_seeded(make_blocks, L, r):
    router = SparseRouter(make_blocks(4), (1, 2, 1), keep_ratio=r)
    x = tokens(B=3, L=L)
    K = math.floor(r * L)
    router(x, generator=gen(5))
    idx = router.last_indices
    assert idx.shape == (3, K) and idx.dtype == torch.long
    assert torch.all(idx[:, 1:] > idx[:, :-1])  # strictly increasing: sorted and distinct
    assert idx.min() >= 0 and idx.max() < L
    assert not torch.equal(idx[0], idx[1])  # drawn per sample
    router(x, generator=gen(5))
    assert torch.equal(router.last_indices, idx)
    router(x, generator=gen(6))
    assert not torch.equal(router.last_indices, idx)


def test_whole_forward_replays_from_generator_with_dropout(make_blocks):
    router = SparseRouter(make_blocks(4, dropout=0.1, drop_path=0.1), (1, 2, 1), keep_ratio=0.25).train()
    x = tokens()
    a, b, c = router(x, gen(9)), router(x, gen(9)), router(x, gen(10))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_middle_stage_gradient_flows_only_through_selected_tokens(make_blocks):
    router = SparseRouter(make_blocks(4), (1, 2, 1), keep_ratio=0.25)
    x0 = tokens().requires_grad_(True)
    idx = RandomSelector().select(x0, 10, gen(0))
    out = router.sparse_stage(x0, idx)
    sel = torch.zeros(2, 40, dtype=torch.bool)
    sel[torch.arange(2)[:, None], idx] = True
    w = torch.randn(out.shape, generator=gen(1))

    # Outputs at selected positions depend on selected inputs only: middle attention never sees the rest.
    (g_sel,) = torch.autograd.grad((out * w * sel[..., None]).sum(), x0, retain_graph=True)
    assert torch.all(g_sel[~sel] == 0)
    assert torch.all(g_sel[sel].abs().sum(-1) > 0)

    # Outputs at unselected positions are the identity path: gradient is exactly the upstream weight there.
    (g_uns,) = torch.autograd.grad((out * w * ~sel[..., None]).sum(), x0)
    assert torch.equal(g_uns[~sel], w[~sel])
    assert torch.all(g_uns[sel] == 0)


@pytest.mark.parametrize("selection", SELECTIONS)
def test_every_selection_strategy_runs_forward_and_backward(make_blocks, selection):
    blocks = make_blocks(4)
    router = SparseRouter(blocks, (1, 2, 1), keep_ratio=0.25, selection=selection, dim=32)
    B, grid = 2, (4, 8)
    x = tokens(B=B, L=32).requires_grad_(True)
    fields = torch.randn(B, 3, 8, 16, generator=gen(2))
    out = router(x, generator=gen(0), context=RoutingContext(fields=fields, grid=grid))
    out.square().mean().backward()
    idx = router.last_indices
    assert idx.shape == (B, 8) and torch.all(idx[:, 1:] > idx[:, :-1])
    assert x.grad is not None and torch.isfinite(x.grad).all()
    middle = blocks[1].attn.qkv.weight.grad
    assert middle is not None and middle.abs().sum() > 0
    head_grads = [p.grad for p in router.selector.parameters()]
    if selection == "learned_st":  # the straight-through gate trains the head through the forecast loss
        assert all(g is not None for g in head_grads) and sum(g.abs().sum() for g in head_grads) > 0
    if selection == "learned":  # ranks mode: the head learns from selector_loss alone, via kept logits
        assert all(g is None for g in head_grads)
        assert router.selector.last_logits.shape == (B, 32) and router.selector.last_logits.requires_grad


def test_score_selectors_pick_the_highest_scores():
    x, first = tokens(B=2, L=16), tokens(B=2, L=16, seed=8)
    idx = make_selector("activation_norm").select(x, 4, context=RoutingContext(first_block=first))
    assert torch.equal(idx, first.norm(dim=-1).topk(4, dim=1).indices.sort(dim=1).values)
    # laplacian: a field that is flat except one sharp patch must select that patch first
    fields = torch.zeros(2, 1, 8, 8)
    fields[:, :, 2:4, 6:8] = torch.tensor([[1.0, -1.0], [-1.0, 1.0]])  # patch (1, 3) -> token 7
    idx = make_selector("laplacian").select(x, 1, context=RoutingContext(fields=fields, grid=(4, 4)))
    assert idx.tolist() == [[7], [7]]


def test_topk_attention_uses_last_dense_early_block(make_blocks):
    blocks = make_blocks(4)
    router = SparseRouter(blocks, (2, 1, 1), keep_ratio=0.25, selection="topk_attention")
    x = tokens()
    out = router(x)
    received = blocks[1].attention_received(blocks[0](x))
    assert torch.equal(router.last_indices, received.topk(10, dim=1).indices.sort(dim=1).values)
    # asking block 1 for its attention leaves its output as the plain SDPA forward
    manual = blocks[3](router.sparse_stage(blocks[1](blocks[0](x)), router.last_indices))
    assert torch.equal(out, manual)


def test_topk_attention_comes_out_of_block_forward_only(make_blocks, monkeypatch):
    # FSDP2 unshards a block's parameters only around its forward: the router must not call any other
    # block method. Any such call fails here, as it did with DTensor parameters.
    blocks = make_blocks(4)
    router = SparseRouter(blocks, (2, 1, 1), keep_ratio=0.25, selection="topk_attention")
    x = tokens()
    expected = blocks[1].attention_received(blocks[0](x)).topk(10, dim=1).indices.sort(dim=1).values

    def outside_forward(*args, **kwargs):
        raise AssertionError("attention_received called outside the block's forward")

    for block in blocks:
        monkeypatch.setattr(block, "attention_received", outside_forward)
        monkeypatch.setattr(block.attn, "attention_received", outside_forward)
    router.activation_checkpointing = True
    out = router(x.requires_grad_(True))
    out.sum().backward()
    assert torch.equal(router.last_indices, expected)


def test_activation_norm_scores_the_first_dense_early_block(make_blocks):
    blocks = make_blocks(4)
    router = SparseRouter(blocks, (2, 1, 1), keep_ratio=0.25, selection="activation_norm")
    x = tokens()
    router(x)
    after_first, after_stage = blocks[0](x), blocks[1](blocks[0](x))
    top = after_first.norm(dim=-1).topk(10, dim=1).indices.sort(dim=1).values
    assert torch.equal(router.last_indices, top)
    # and it is a different ranking from the end of the dense-early stage, so the test can tell them apart
    assert not torch.equal(top, after_stage.norm(dim=-1).topk(10, dim=1).indices.sort(dim=1).values)
    with pytest.raises(ValueError, match="first dense-early block"):
        SparseRouter(make_blocks(4), (0, 3, 1), keep_ratio=0.5, selection="activation_norm")


def test_learned_gate_is_exactly_one_in_the_forward(make_blocks):
    blocks = make_blocks(4)
    learned = SparseRouter(blocks, (1, 2, 1), keep_ratio=0.25, selection="learned", dim=32)
    plain = SparseRouter(blocks, (1, 2, 1), keep_ratio=0.25)
    x = tokens()
    idx = learned.selector.select(x, 10)
    assert torch.equal(learned.sparse_stage(x, idx), plain.sparse_stage(x, idx))


def test_deterministic_eval_selection_is_fixed_and_shared_across_the_batch(make_blocks):
    router = SparseRouter(make_blocks(4), (1, 2, 1), keep_ratio=0.25, deterministic=True)
    x = tokens(B=3)
    router.eval()
    a = router(x)
    first = router.last_indices
    b = router(x, generator=gen(123))  # generator ignored for the fixed eval selection
    assert torch.equal(a, b) and torch.equal(router.last_indices, first)
    assert torch.equal(first[0], first[1]) and torch.equal(first[1], first[2])
    router.train()
    router(x, generator=gen(0))
    assert not torch.equal(router.last_indices, first)


class RecordingBlock(nn.Module):
    """A block with extra arguments (like an EDM block with conditioning tokens and noise embedding)."""

    def __init__(self, dim):
        super().__init__()
        self.lin = nn.Linear(dim, dim)
        self.seen = []

    def forward(self, x, generator=None, cond=None, noise=None, per_token=None):
        self.seen.append((x.shape[1], cond.shape[1], tuple(noise.shape), per_token.shape[1]))
        # asymmetric: queries are the (possibly routed) tokens, keys/values the full conditioning sequence
        attn = torch.softmax(x @ cond.transpose(1, 2), dim=-1) @ cond
        return x + self.lin(attn) * noise[:, None, :] + per_token


def test_block_kwargs_pass_through_and_token_kwargs_are_gathered():
    blocks = [RecordingBlock(8) for _ in range(3)]
    router = SparseRouter(blocks, (1, 1, 1), keep_ratio=0.5)
    x, cond = tokens(L=20, D=8), tokens(L=20, D=8, seed=1)
    noise, per_token = torch.randn(2, 8), torch.randn(2, 20, 8)
    out = router(x, gen(0), cond=cond, noise=noise, per_token=per_token, token_kwargs=("per_token",))
    assert out.shape == x.shape
    # (tokens, conditioning tokens, noise shape, per-token kwarg length) seen by each block
    dense, middle = (20, 20, (2, 8), 20), (10, 20, (2, 8), 10)
    assert [b.seen for b in blocks] == [[dense], [middle], [dense]]
    # the middle block got per_token gathered at exactly the routed indices
    idx = router.last_indices
    x0 = blocks[0](x, cond=cond, noise=noise, per_token=per_token)
    at = idx[..., None].expand(-1, -1, 8)
    manual_mid = blocks[1](x0.gather(1, at), cond=cond, noise=noise, per_token=per_token.gather(1, at))
    kwargs = dict(cond=cond, noise=noise, per_token=per_token)
    routed = router.sparse_stage(x0, idx, token_kwargs=("per_token",), block_kwargs=kwargs)
    torch.testing.assert_close(routed.gather(1, at), manual_mid)


def test_activation_checkpointing_keeps_outputs_grads_and_generator_replay(make_blocks):
    def run(checkpointing):
        blocks = make_blocks(4, dropout=0.2, drop_path=0.2)
        router = SparseRouter(blocks, (1, 2, 1), keep_ratio=0.25).train()
        router.activation_checkpointing = checkpointing
        x = tokens().requires_grad_(True)
        g = gen(11)
        out = router(x, generator=g)
        out.square().sum().backward()
        after = torch.rand(3, generator=g)  # the generator must be advanced identically
        return out.detach(), x.grad, blocks[1].mlp.fc1.weight.grad, after

    plain, ckpt = run(False), run(True)
    for a, b in zip(plain, ckpt):
        assert torch.equal(a, b)


def test_routing_generator_controls_selection_independently_of_dropout(make_blocks):
    router = SparseRouter(make_blocks(4, dropout=0.2), (1, 2, 1), keep_ratio=0.25).train()
    x = tokens()
    a = router(x, generator=gen(0), routing_generator=gen(100))
    idx_a = router.last_indices
    b = router(x, generator=gen(1), routing_generator=gen(100))
    assert torch.equal(router.last_indices, idx_a)  # same routing draw
    assert not torch.equal(a, b)  # different dropout draws
    c = router(x, generator=gen(0), routing_generator=gen(101))
    assert not torch.equal(router.last_indices, idx_a)
    assert torch.equal(router(x, generator=gen(0), routing_generator=gen(101)), c)  # replays
