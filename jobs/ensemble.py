"""Nested M x N (x R) ensembles of the uplifted end-to-end chain on Ray actors, and their variance split.

    python jobs/ensemble.py stages=runs/train_e2e/e2e members.M=7 members.N=7 lead_steps=10
    python jobs/ensemble.py ... members.R=3 keep_members=false workers.actors=4 workers.num_gpus=0.5
    python jobs/ensemble.py ... out_dir=<the interrupted run>      # continues from the units written
"""

import sys

from wxray.job import run_job
from wxray.platform.ensemble.batch import EnsembleConfig, ensemble

if __name__ == "__main__":
    sys.exit(run_job("ensemble", EnsembleConfig, ensemble, doc=__doc__))
