"""Train the end-to-end system stage by stage on Ray Train: observations -> encoder -> processor -> decoder.

    python jobs/train_e2e.py stage=encoder                  # the demo: sample store + sample streams
    python jobs/train_e2e.py stage=processor
    python jobs/train_e2e.py stage=decoder
    python jobs/train_e2e.py stage=chain                    # encoder + processor finetuned at lead 1
    python jobs/train_e2e.py --config configs/e2e_demo.yaml stage=encoder run_name=exp1
    python jobs/forecast_e2e.py stages=runs/train_e2e/exp1  # analysis -> rollout -> stations
"""

import sys

from wxray.job import run_job
from wxray.platform.train.e2e import train_e2e
from wxray.platform.train.stage_config import TrainE2EConfig

if __name__ == "__main__":
    sys.exit(run_job("train_e2e", TrainE2EConfig, train_e2e, doc=__doc__))
