"""ResSlimViT and the model factory: shapes, dense equivalence, tokenizer channel order, validation."""

import pytest
import torch

from wxray.models import MODEL_NAMES, ResSlimViT, SprintViT, VariableAggregation, build_model, sincos_pos_embed_2d


def gen(seed):
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_every_model_maps_input_grid_to_output_grid(tiny_kwargs, tiny_input, name):
    kw = {**tiny_kwargs, "keep_ratio": 1.0 if name == "droppath" else 0.25, "drop_path": 0.1}
    model = build_model(name, **kw).train()
    y = model(tiny_input, generator=gen(0))
    assert y.shape == (2, 3, 16, 32)
    y.square().mean().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_small_8x16_grid_with_patch_4_and_no_constants():
    model = ResSlimViT(2, 3, 0, 4, (8, 16), 4, 32, 4, 4, split=(1, 2, 1), keep_ratio=0.5)
    assert model(torch.randn(1, 6, 8, 16), generator=gen(0)).shape == (1, 4, 8, 16)


def test_keep_ratio_one_equals_plain_dense_forward_bit_for_bit(tiny_kwargs, tiny_input):
    torch.manual_seed(0)
    model = build_model("reslim", **tiny_kwargs, keep_ratio=1.0).eval()
    tokens = model.embed(tiny_input)
    for block in model.router.blocks:
        tokens = block(tokens)
    reference = model.decode(tokens) + model.skip(tiny_input)
    assert torch.equal(model(tiny_input), reference)


def test_droppath_and_dense_reslim_agree_given_same_weights(tiny_kwargs, tiny_input):
    torch.manual_seed(0)
    dense = build_model("reslim", **tiny_kwargs, keep_ratio=1.0).eval()
    droppath = build_model("droppath", **tiny_kwargs, drop_path=0.2).eval()
    droppath.load_state_dict(dense.state_dict())
    assert torch.equal(dense(tiny_input), droppath(tiny_input))  # drop path is inactive at eval
    droppath.train()
    assert not torch.equal(droppath(tiny_input, gen(1)), droppath(tiny_input, gen(2)))


def test_sparse_model_differs_from_dense_with_same_weights(tiny_kwargs, tiny_input):
    torch.manual_seed(0)
    dense = build_model("reslim", **tiny_kwargs, keep_ratio=1.0)
    sparse = build_model("reslim", **tiny_kwargs, keep_ratio=0.25)
    sparse.load_state_dict(dense.state_dict())
    assert not torch.allclose(dense(tiny_input), sparse(tiny_input, gen(0)))
    assert sparse.router.last_indices.shape == (2, 32)  # floor(0.25 * 128)


def test_forward_replays_from_generator_and_seeds_differ(tiny_kwargs, tiny_input):
    model = build_model("reslim", **tiny_kwargs, keep_ratio=0.25, dropout=0.1, drop_path=0.1).train()
    a, b, c = (model(tiny_input, gen(s)) for s in (4, 4, 5))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_deterministic_eval_gives_identical_outputs_without_generator(tiny_kwargs, tiny_input):
    model = build_model("reslim", **tiny_kwargs, keep_ratio=0.25, deterministic_eval=True).eval()
    assert torch.equal(model(tiny_input), model(tiny_input))
    # a sample's forecast does not depend on what else is in the batch (up to BLAS batch-size rounding)
    torch.testing.assert_close(model(tiny_input[1:]), model(tiny_input)[1:], rtol=1e-5, atol=1e-6)
    stochastic = build_model("reslim", **tiny_kwargs, keep_ratio=0.25).eval()
    assert not torch.equal(stochastic(tiny_input, gen(0)), stochastic(tiny_input, gen(1)))


def test_tokenizer_embeds_each_variable_from_its_own_history_channels(tiny_kwargs):
    # Channels are history-major: channel t * n_vars + v. Perturbing variable v at any history step
    # must change only variable v's patch tokens.
    model = build_model("reslim", **tiny_kwargs)
    tok = model.tokenizer
    x = torch.randn(1, 7, 16, 32)

    def per_variable(inp):
        return tok.var_patch(inp[:, :6].index_select(1, tok.order)).view(1, 3, 32, -1)

    base = per_variable(x)
    for t in range(2):
        for v in range(3):
            bumped = x.clone()
            bumped[:, t * 3 + v] += 1.0
            changed = (per_variable(bumped) != base).flatten(2).any(dim=2)[0]
            assert changed.tolist() == [i == v for i in range(3)], (t, v)
    # the constant field (last channel) reaches the tokens only through its own embedding
    bumped = x.clone()
    bumped[:, 6] += 1.0
    assert torch.equal(per_variable(bumped), base)
    assert not torch.equal(tok(bumped), tok(x))


def test_variable_aggregation_is_multi_head_attention_of_the_shared_query():
    # Eq. 1 against torch's attention on the (B * L, heads, 1, hd) layout the einsums avoid
    torch.manual_seed(0)
    agg = VariableAggregation(32, 4)
    tokens = torch.randn(2, 5, 12, 32)  # (B, V, L, D)
    B, V, L, D = tokens.shape
    t = tokens.permute(0, 2, 1, 3).reshape(B * L, V, D)
    k, v = agg.kv(t).view(B * L, V, 2, 4, 8).permute(2, 0, 3, 1, 4)
    q = agg.q(agg.query).view(1, 4, 1, 8).expand(B * L, -1, -1, -1)
    ref = agg.proj(torch.nn.functional.scaled_dot_product_attention(q, k, v).reshape(B, L, D))
    torch.testing.assert_close(agg(tokens), ref, rtol=1e-5, atol=1e-6)
    # each position attends over its own variables only
    bumped = tokens.clone()
    bumped[1, :, 7] += 1.0
    changed = (agg(bumped) != agg(tokens)).any(dim=-1)
    assert changed.nonzero().tolist() == [[1, 7]]


@pytest.mark.gpu
def test_variable_aggregation_takes_more_positions_than_a_cuda_grid_dimension():
    # B * L = 70000 > 65535: the fused attention kernels refuse it (8 x 8192 tokens at 1.4 deg did)
    torch.manual_seed(0)
    agg = VariableAggregation(16, 2)
    tokens = torch.randn(1, 3, 70_000, 16)
    want = agg(tokens)
    with torch.autocast("cuda", torch.bfloat16):
        got = agg.cuda()(tokens.cuda())
    torch.testing.assert_close(got.float().cpu(), want, rtol=0.05, atol=0.05)


def test_decode_places_each_token_on_its_own_patch(tiny_kwargs):
    # token t = row * 16 + col of the 8x16 token grid must land on pixels [2row : 2row+2, 2col : 2col+2]
    model = build_model("reslim", **tiny_kwargs)
    tokens = torch.randn(1, 128, 32)
    base = model.decode(tokens)
    for t in (0, 17, 127):
        bumped = tokens.clone()
        bumped[0, t] += 1.0
        changed = (model.decode(bumped) != base).any(dim=1)[0]  # (16, 32)
        expected = torch.zeros(16, 32, dtype=torch.bool)
        row, col = divmod(t, 16)
        expected[2 * row : 2 * row + 2, 2 * col : 2 * col + 2] = True
        assert torch.equal(changed, expected), t


def test_sincos_position_embedding_is_distinct_per_token():
    pe = sincos_pos_embed_2d(32, 8, 16)[0]
    assert pe.shape == (128, 32)
    assert torch.cdist(pe, pe).add(torch.eye(128)).min() > 1e-3


def test_learned_position_embedding_starts_at_sincos_and_trains(tiny_kwargs, tiny_input):
    model = build_model("reslim", **tiny_kwargs, keep_ratio=0.25)  # pos_embed="learned" by default
    pe = model.tokenizer.pos_embed
    assert isinstance(pe, torch.nn.Parameter) and pe.shape == (1, 128, 32)
    assert torch.equal(pe.detach(), sincos_pos_embed_2d(32, 8, 16))
    assert "tokenizer.pos_embed" in model.state_dict()
    model(tiny_input, gen(0)).square().mean().backward()
    assert pe.grad is not None and pe.grad.abs().sum() > 0


def test_fixed_position_embedding_is_a_non_persistent_buffer(tiny_kwargs, tiny_input):
    model = build_model("reslim", **tiny_kwargs, pos_embed="fixed")
    pe = model.tokenizer.pos_embed
    assert not isinstance(pe, torch.nn.Parameter)
    assert torch.equal(pe, sincos_pos_embed_2d(32, 8, 16))
    assert "tokenizer.pos_embed" in dict(model.named_buffers())
    assert "tokenizer.pos_embed" not in model.state_dict()
    assert all(p is not pe for p in model.parameters())
    learned = build_model("reslim", **tiny_kwargs)
    n = sum(p.numel() for p in learned.parameters()) - sum(p.numel() for p in model.parameters())
    assert n == 128 * 32  # exactly the L x D table


@pytest.mark.parametrize("name", ["reslim", "sprint"])
def test_residual_stream_after_the_sparse_stage_stays_fp32_under_bf16_autocast(tiny_kwargs, tiny_input, name):
    # Res-Slim's scatter_add keeps the fp32 stream; Sprint's fusion Linear returns bf16 under autocast and
    # must be cast back, or its dense-late blocks would run on a bf16 stream and the baseline comparison
    # would differ in precision as well as in the sparse stage.
    model = build_model(name, **tiny_kwargs, keep_ratio=0.25)
    seen = []
    model.router.blocks[-1].register_forward_pre_hook(lambda mod, args: seen.append(args[0].dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = model(tiny_input, gen(0))
        if name == "sprint":  # the cast is what keeps it fp32
            assert model.router.fuse(torch.zeros(1, 64)).dtype == torch.bfloat16
    assert seen == [torch.float32]
    assert torch.isfinite(y.float()).all()


def test_activation_checkpointing_same_outputs_and_grads(tiny_kwargs, tiny_input):
    def run(checkpointing):
        torch.manual_seed(0)
        model = build_model("reslim", **tiny_kwargs, keep_ratio=0.25, dropout=0.1, drop_path=0.1).train()
        model.activation_checkpointing = checkpointing
        y = model(tiny_input, gen(3))
        y.square().mean().backward()
        return y.detach(), model.router.blocks[2].attn.qkv.weight.grad, model.tokenizer.var_embed.grad

    for a, b in zip(run(False), run(True)):
        assert torch.equal(a, b)


def test_climax_has_no_cnn_skip_and_sprint_fuses_with_a_mask_token(tiny_kwargs, tiny_input):
    climax = build_model("climax", **tiny_kwargs)
    assert climax.skip is None
    sprint = build_model("sprint", **tiny_kwargs, keep_ratio=0.25)
    assert isinstance(sprint, SprintViT)
    sprint(tiny_input, gen(0)).square().mean().backward()
    assert sprint.router.mask_token.grad.abs().sum() > 0
    assert sprint.router.fuse.weight.grad.abs().sum() > 0


@pytest.mark.parametrize(
    "override,match",
    [
        ({"patch_size": 3}, "patch_size 3 does not divide"),
        ({"img_size": (16, 30), "patch_size": 4}, "does not divide"),
        ({"num_heads": 5}, "not divisible by num_heads"),
        ({"embed_dim": 34, "num_heads": 2}, "divisible by 4"),
        ({"split": (1, 1, 1)}, "summing to the number of blocks"),
        ({"keep_ratio": 0.0}, "keep_ratio"),
        ({"keep_ratio": 1.2}, "keep_ratio"),
        ({"keep_ratio": 0.005}, "selects no tokens"),
        ({"selection": "nope"}, "unknown selection"),
        ({"dropout": 1.0}, "dropout"),
        ({"history": 0}, "history"),
        ({"pos_embed": "rope"}, "pos_embed must be"),
    ],
)
def test_bad_constructor_args_raise_value_error(tiny_kwargs, override, match):
    with pytest.raises(ValueError, match=match):
        ResSlimViT(**{**tiny_kwargs, **override})


def test_bad_factory_args_and_inputs_raise_value_error(tiny_kwargs):
    with pytest.raises(ValueError, match="unknown model"):
        build_model("unet", **tiny_kwargs)
    with pytest.raises(ValueError, match="keep_ratio must be 1.0"):
        build_model("droppath", **tiny_kwargs, keep_ratio=0.5, drop_path=0.1)
    with pytest.raises(ValueError, match=r"droppath needs drop_path > 0"):
        build_model("droppath", **tiny_kwargs)
    with pytest.raises(ValueError, match="no CNN skip"):
        build_model("climax", **tiny_kwargs, cnn_skip=True)
    model = build_model("reslim", **tiny_kwargs)
    with pytest.raises(ValueError, match=r"expected input \(B, 7, 16, 32\)"):
        model(torch.randn(2, 6, 16, 32))
