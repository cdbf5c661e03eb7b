#!/usr/bin/env python
"""Score a forecast zarr against a truth store: scorecard (netCDF + CSV), plots, MLflow, RESULT line.

    python jobs/evaluate.py forecast=<zarr> truth=<store> [baseline=<zarr>|persistence] [variables=[...]]
    python jobs/evaluate.py forecast=<zarr> truth=<store> ray_tasks=32 block_mib=512   # blocks on Ray tasks
    python jobs/evaluate.py --config configs/evaluate.yaml truth=<store> make_persistence=true leads=[6,24]

Every option is a field of `wxray.verify.evaluate.EvaluateConfig`; bad input exits 2 with a one-line error.
"""

from __future__ import annotations

import sys

from wxray.job import run_job
from wxray.platform.ensemble.evaluate import evaluate_job
from wxray.verify.evaluate import EvaluateConfig


def main(argv: list[str] | None = None) -> int:
    return run_job("evaluate", EvaluateConfig, evaluate_job, argv, doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
