"""jobs/train_sparse.py model.name=edm: the generative Res-Slim-EDM through the same loop (FSDP2, checkpoints,
MLflow), then an ensemble rollout of EDM samples scored as the deterministic models' rollouts are."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from tests.mlflow_db import fresh_uri
from tests.platform.test_trainer import _history, _run


@pytest.mark.slow
def test_edm_trains_sharded_and_forecasts_sample_ensembles(ray_session, wave_store, tmp_path, capsys):
    out, console = tmp_path / "edm", []
    fresh_uri(tmp_path)  # _run's MLflow store
    rc, res, err = _run(capsys, wave_store, tmp_path, f"out_dir={out}", "model.name=edm", "scaling.num_workers=2",
                        "scaling.cpus_per_worker=0.5", "train.epochs=2", "train.routing_members=2",
                        "sampler.steps=2", "sampler.sigma_max=10", "train.cuda_graphs=true",
                        "train.compile=default", "train.compile_backend=aot_eager", console=console)
    assert rc == 0, err
    # compiled (FSDP2-sharded, the EDM loss's draws eager between graphs); asked for CUDA graphs on CPU workers: one
    # line says the steps run uncaptured, and training goes on
    said = [line for line in console if "train.cuda_graphs:" in line]
    assert len(said) == 1 and "need a CUDA device, the steps run uncaptured on cpu" in said[0], console
    assert sum("compile: torch.compile of ResSlimEDM, backend=aot_eager" in line for line in console) == 1, \
        "\n".join(console)
    run = res["mlflow_run_id"]
    assert set(_history(tmp_path, run, "train/fsdp_sharded")) == {1.0}  # EDM blocks sharded as FSDP2 units
    losses = _history(tmp_path, run, "train/epoch_loss")
    val = _history(tmp_path, run, "val/loss")
    assert len(losses) == 2 and np.isfinite(losses).all() and losses[-1] < losses[0], losses
    assert len(val) == 2 and np.isfinite(val).all()  # the EDM loss at fixed noise draws
    assert set(res["val_rmse"]) == {"geopotential_500", "temperature_500"}  # of one sample per window
    roll = res["rollout"]
    assert roll["members"] == 2 and roll["scored"] == "ensemble mean" and roll["lead_hours"] == [6, 12]
    fc = xr.open_zarr(res["forecast"])
    z = fc.geopotential.sel(level=500).values  # (init, lead, member, lat, lon)
    assert fc.sizes["member"] == 2 and np.isfinite(z).all() and not np.array_equal(z[:, :, 0], z[:, :, 1])
