"""Train a Res-Slim-ViT forecaster with Sparse-Reslim routing on Ray Train (FSDP2), tracked in MLflow.

    python jobs/train_sparse.py                                   # the demo: local Ray, sample store
    python jobs/train_sparse.py --config configs/train_sparse.yaml model.keep_ratio=0.5 scaling.num_workers=2
    python jobs/train_sparse.py run_name=exp1                     # again with the same name: resumes
    ray job submit --working-dir . -- python jobs/train_sparse.py data.store=/path/era5.zarr
"""

import sys

from wxray.job import run_job
from wxray.platform.train.config import TrainSparseConfig
from wxray.platform.train.sparse import train_sparse

if __name__ == "__main__":
    sys.exit(run_job("train_sparse", TrainSparseConfig, train_sparse, doc=__doc__))
