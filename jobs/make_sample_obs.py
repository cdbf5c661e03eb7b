"""Derive synthetic observation streams from a store (by default the embedded shallow-water sample).

    python jobs/make_sample_obs.py                                   # data/sample_obs from data/sample_32x64.zarr
    python jobs/make_sample_obs.py store=<store> out=<obs dir> seed=1 stations=500

Writes an obs dir (obs.yaml; point streams `stations`, `ships`, `profiles` as Parquet under points/; gridded
swath streams `swath_tb`, `swath_wind` as zarr) atomically and prints `RESULT {json}` (streams, counts,
noise). The truth stays in the store. Seeded, deterministic. See wxray/data/obs/sample.py.
"""

import sys

from wxray.job import run_job
from wxray.prepare.obs import SampleObsConfig, make_sample_obs_main

if __name__ == "__main__":
    sys.exit(run_job("make_sample_obs", SampleObsConfig, make_sample_obs_main, doc=__doc__))
