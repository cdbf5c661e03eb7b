"""Observing-system experiments: each stream withheld in turn from the uplifted chain's nested ensemble.

    python jobs/ose.py stages=runs/train_e2e/e2e members.M=4 members.N=4 streams=[stations,ships]
    python jobs/ose.py stages=runs/train_e2e/e2e                     # every stream, one at a time
"""

import sys

from wxray.job import run_job
from wxray.platform.ensemble.ose import OSEConfig, ose

if __name__ == "__main__":
    sys.exit(run_job("ose", OSEConfig, ose, doc=__doc__))
