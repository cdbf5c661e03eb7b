"""One seed scheme: every random draw of a forecast comes from a generator seeded by its coordinates, never from
a shared stream or a process's RNG state:

    seed of (t, c1, c2, ...) = SeedSequence([seed, t, c1, c2, ...]).generate_state(1, uint64)[0]

with t the init time in whole seconds since 1970-01-01 (two's complement mod 2**64, so earlier times work
too). The coordinates say what is drawn:

    (m,)               member m of a forecaster's routing ensemble, or sample m of a generative one (rollout.py)
    (ENCODER, i)       the stochastic encoder's noise of draw i                     (nested.py)
    (DROPOUT, i, j)    the MC-dropout masks of dropout member j of draw i
    (ROUTING, i, j, k) the token routing of routing draw k of that member
    (ROUTING,)         the token routing of a deterministic end-to-end forecast (forecast_e2e.py)

A generator advances lead step by lead step, in order. So any member, computed alone or beside others, by any
actor, before or after a restart, draws the same numbers (bit-identical on the same device type and thread
count), and a denial run shares every draw with its baseline (common random numbers).
"""

from __future__ import annotations

import numpy as np
import torch

ENCODER, DROPOUT, ROUTING = 1, 2, 3  # the source of a nested ensemble's draw, its first coordinate


def coordinate_seed(seed: int, init_time: np.datetime64, *coords: int) -> int:
    """The seed of the draw at (init_time, *coords); see the module docstring."""
    t = int(np.datetime64(init_time, "s").astype(np.int64)) % 2**64
    return int(np.random.SeedSequence([int(seed), t, *map(int, coords)]).generate_state(1, np.uint64)[0])


def coordinate_generator(seed: int, init_time: np.datetime64, *coords: int) -> torch.Generator:
    return torch.Generator().manual_seed(coordinate_seed(seed, init_time, *coords))
