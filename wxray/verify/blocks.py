"""Blocks of the scorecard's scoring: how many inits (and which latitude rows) one block reads, and the map
that scores the blocks (in this process, or in worker processes).

A block is one channel at one lead for `init_block` consecutive inits with all their members, on latitude
bands of `rows` rows (one band, the whole grid, unless one init's members exceed the budget). In memory:

    block bytes = inits x rows x longitudes x 8 x (K + 1 [+ 1])

float64 values: the members of the larger of forecast and baseline (they are scored one after the other), the
truth [and the climatology]. `plan_blocks` takes the most inits within `block_bytes` (`DEFAULT_BLOCK_MIB`), or
one init in bands of as many rows as fit. Scoring a block holds a few times its bytes (float64 copy, sorted
members, |x - y|, the variance or the ANOVA split) and leaves behind only per-init series (channel x lead x
init), per-point sums of the time-mean maps and the rank counts: so the peak memory is set by the budget, not
by the number of inits or members. Scores that are not spatial means of pointwise values (ACC, SSIM:
`Metric.banded`) need whole fields; in bands they are scored on the ensemble mean assembled band by band, so
they add one init's grid (no members) per model, truth and climatology, whatever K.

`map_blocks` is any callable with the signature of builtin `map` that returns the results in order: builtin
`map` (one process), `ProcessMap(workers)` (worker processes, as `block_map(workers)` picks), or a Ray
layer's fan-out of blocks to tasks. Each block is scored alone, and the results are reduced in order in the
caller, so the scorecard is the same, to the last bit, whatever the map or the number of workers.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from functools import partial
from multiprocessing import get_context
from typing import Any

from wxray.errors import ConfigError

DEFAULT_BLOCK_MIB = 64  # the default budget of one block's float64 members, truth and climatology
MIB = 2**20


@dataclass(frozen=True)
class BlockPlan:
    """`init_block` inits per block, latitude bands of `rows` rows (`rows` = nlat: the whole grid)."""

    init_block: int
    rows: int
    nlat: int

    @property
    def banded(self) -> bool:
        return self.rows < self.nlat

    def init_slices(self, n_init: int) -> list[slice]:
        return [slice(i, min(i + self.init_block, n_init)) for i in range(0, n_init, self.init_block)]


def bands(nlat: int, rows: int) -> list[slice]:
    """Latitude bands of `rows` rows (the last one shorter), south to north."""
    return [slice(r, min(r + rows, nlat)) for r in range(0, nlat, rows)]


def plan_blocks(n_init: int, nlat: int, nlon: int, values_per_point: int, init_block: int = 0,
                block_bytes: int = DEFAULT_BLOCK_MIB * MIB) -> BlockPlan:
    """The blocks of one channel at one lead: `init_block` inits (0: as many as `block_bytes` holds, at least
    one), and bands of latitude rows where that many inits of all `values_per_point` fields (K members, truth,
    climatology) exceed `block_bytes`."""
    if init_block < 0 or block_bytes <= 0:
        raise ConfigError(f"config keys 'init_block' (>= 0) and 'block_mib' (> 0): got {init_block} and "
                          f"{block_bytes / MIB:g} MiB")
    row_bytes = 8 * values_per_point * nlon
    if init_block == 0:
        init_block = max(1, block_bytes // (row_bytes * nlat))
    init_block = max(1, min(init_block, n_init))
    rows = nlat if init_block * row_bytes * nlat <= block_bytes else max(1, block_bytes // (init_block * row_bytes))
    return BlockPlan(init_block, min(rows, nlat), nlat)


def ordered_ahead(submit: Callable[..., Any], result: Callable[[Any], Any], iterables: Iterable[Iterable],
                  ahead: int, cancel: Callable[[Any], Any] | None = None) -> Iterator:
    """`result(submit(*args))` for each `args` of `zip(*iterables)`, in order, at most `ahead` submitted
    beyond the one awaited: the inputs in flight, not all of them, are held. `submit` starts one item's work (a
    future, a Ray object reference) and `result` waits for it; on an error or an abandoned iteration `cancel`
    drops what is still pending."""
    pending: deque = deque()
    try:
        for args in zip(*iterables):
            pending.append(submit(*args))
            if len(pending) > ahead:
                yield result(pending.popleft())
        while pending:
            yield result(pending.popleft())
    finally:
        if cancel is not None:
            for work in pending:
                cancel(work)


class ProcessMap:
    """`map` over `workers` processes (spawned: no fork of a threaded parent), results in order, at most
    2 x workers blocks in flight (a block's inputs, not all of them)."""

    def __init__(self, workers: int):
        self.workers = workers

    def __call__(self, fn: Callable, *iterables: Iterable) -> Iterator:
        with ProcessPoolExecutor(self.workers, mp_context=get_context("spawn")) as pool:
            yield from ordered_ahead(partial(pool.submit, fn), Future.result, iterables, 2 * self.workers - 1,
                                     cancel=Future.cancel)


def block_map(workers: int = 1) -> Callable:
    """Builtin `map` for one worker, else a `ProcessMap`."""
    if workers < 1:
        raise ConfigError(f"config key 'workers' must be >= 1, got {workers}")
    return map if workers == 1 else ProcessMap(workers)
