"""Tiny model configs shared by the model tests (D=32, depth 4, 8x16 / 16x32 grids: fast on 2 CPU cores)."""

import pytest
import torch

from wxray.models import Block


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models gain nothing from intra-op threads, and on a shared 2-core box they only contend."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def tiny_kwargs():
    """ResSlimViT kwargs: 3 variables x 2 history steps + 1 constant on a 16x32 grid, L = 128 tokens."""
    return dict(
        n_vars=3,
        history=2,
        n_const=1,
        n_out=3,
        img_size=(16, 32),
        patch_size=2,
        embed_dim=32,
        depth=4,
        num_heads=4,
        split=(1, 2, 1),
    )


@pytest.fixture
def tiny_input():
    return torch.randn(2, 3 * 2 + 1, 16, 32, generator=torch.Generator().manual_seed(123))


@pytest.fixture
def make_blocks():
    """make_blocks(n, dropout=..., drop_path=...) -> list of D=32, 4-head Blocks with seeded weights."""

    def make(n=4, dim=32, heads=4, dropout=0.0, drop_path=0.0, seed=0):
        torch.manual_seed(seed)
        return [Block(dim, heads, 2.0, dropout=dropout, drop_path=drop_path) for _ in range(n)]

    return make
