"""Score-based selections under FSDP2 on 2 workers: attention received and the learned head's BCE in forward."""

from __future__ import annotations

import json
import math

import mlflow
import pytest

from tests.platform.conftest import write_tiny_store
from wxray.job import run_job
from wxray.platform.train_config import TrainSparseConfig
from wxray.platform.trainer import train_sparse

SMALL = ["data.generate_sample=false", "model.embed_dim=32", "model.depth=4", "model.split=[1,2,1]",
         "model.num_heads=4", "model.keep_ratio=0.25", "data.batch_size=4", "optim.lr=3e-3",
         "optim.warmup_steps=3", "train.rollout_steps=0", "train.log_every=1"]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("store") / "waves.zarr"
    write_tiny_store(path, n_traj=3, steps=12, grid=(8, 16), levels=(500,))
    return path


def _history(uri: str, run_id: str, key: str) -> list[float]:
    client = mlflow.tracking.MlflowClient(uri)
    return [m.value for m in sorted(client.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp))]


@pytest.mark.slow
@pytest.mark.parametrize("selection", ["topk_attention", "learned"])
def test_selection_trains_on_two_fsdp_workers(ray_session, store, tmp_path, capsys, selection):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    argv = [f"data.store={store}", f"tracking.uri={uri}", f"out_dir={tmp_path / 'run'}", *SMALL,
            f"model.selection={selection}", "scaling.num_workers=2", "scaling.cpus_per_worker=0.5",
            "train.epochs=1"]
    rc = run_job("train_sparse", TrainSparseConfig, train_sparse, argv)
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    res = json.loads([line for line in cap.out.splitlines() if line.startswith("RESULT ")][-1][7:])
    assert math.isfinite(res["val_loss"]), res
    run_id = res["mlflow_run_id"]
    assert _history(uri, run_id, "train/fsdp_sharded") == [1.0]  # the blocks really were DTensor-sharded
    aux = _history(uri, run_id, "train/selector_loss")
    if selection == "learned":  # the head's BCE was computed from logits kept in the sharded forward
        assert aux and all(math.isfinite(v) and 0 < v < 2 for v in aux), aux
    else:
        assert aux == []
