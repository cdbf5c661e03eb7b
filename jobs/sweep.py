"""Sweep training config keys with Ray Tune: each trial a jobs/train_sparse.py run, ASHA early stopping,
one MLflow parent run with a child run per trial, results table, plots and the best config as YAML.

    python jobs/sweep.py --config configs/sweeps/keep_ratio.yaml
    python jobs/sweep.py --config configs/sweeps/keep_ratio.yaml out_dir=runs/sweep/kr   # again: restores
    python jobs/train_sparse.py --config runs/sweep/kr/best_config.yaml
"""

import sys

from wxray.job import run_job
from wxray.tune.sweep import SweepConfig, sweep

if __name__ == "__main__":
    sys.exit(run_job("sweep", SweepConfig, sweep, doc=__doc__))
