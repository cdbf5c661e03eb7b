"""Uplift a trained end-to-end chain to a stochastic one: noise-conditioned encoder, MC-dropout processor,
both finetuned with the fair CRPS over members held as a batch dimension.

    python jobs/finetune_stochastic.py stage=encoder                      # after make demo-e2e (run name e2e)
    python jobs/finetune_stochastic.py stage=processor                    # on the stochastic encoder's analyses
    python jobs/finetune_stochastic.py --config configs/paper/stochastic_encoder.yaml stage=encoder run_name=exp1
    python jobs/forecast_e2e.py members.M=4 members.N=4                   # the nested M x N ensemble
"""

import sys

from wxray.job import run_job
from wxray.platform.train.stochastic import FinetuneStochasticConfig, finetune_stochastic

if __name__ == "__main__":
    sys.exit(run_job("finetune_stochastic", FinetuneStochasticConfig, finetune_stochastic, doc=__doc__))
