"""Generate the embedded shallow-water sample store (torch-harmonics ShallowWaterSolver; NOT ERA5).

    python jobs/make_sample_data.py out=data/sample_32x64.zarr grid=32x64 days=25 seed=0 trajectories=4

`days` are kept per trajectory (4 steps a day, 6-hourly); each trajectory starts from its own random
balanced state (seeded) after a discarded spin-up. Writes the store with its `stats/*` groups atomically
and prints `RESULT {json}` (store, n_times, grid, trajectories, generation seconds).
See wxray/data/sample.py.
"""

import sys

from wxray.job import run_job
from wxray.prepare.stores import SampleDataConfig, make_sample_main

if __name__ == "__main__":
    sys.exit(run_job("make_sample_data", SampleDataConfig, make_sample_main, doc=__doc__))
