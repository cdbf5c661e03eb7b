"""Generate the embedded shallow-water sample store (torch-harmonics ShallowWaterSolver; NOT ERA5).

    python jobs/make_sample_data.py out=data/sample_32x64.zarr grid=32x64 days=25 seed=0 trajectories=4

`days` are kept per trajectory (4 steps a day, 6-hourly); each trajectory starts from its own random
balanced state (seeded) after a discarded spin-up. Writes the store with its `stats/*` groups atomically
and prints `RESULT {json}` (store, n_times, grid, trajectories, generation seconds).

The paper's grids work too (grid=64x128, grid=128x256): each 6 h step takes as many solver steps as keep
the Adams-Bashforth 3 scheme stable on the fastest resolved gravity wave (24 of 900 s at 32x64, 51 at
64x128, 105 at 128x256; `wxray.data.sample.substeps`), so with the other defaults 64x128 takes about 50 s
and 128x256 6-8 min on one core. See wxray/data/sample.py.
"""

import sys

from wxray.job import run_job
from wxray.prepare.stores import SampleDataConfig, make_sample_main

if __name__ == "__main__":
    sys.exit(run_job("make_sample_data", SampleDataConfig, make_sample_main, doc=__doc__))
