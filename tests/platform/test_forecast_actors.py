"""jobs/forecast.py with workers.actors > 0: (init, member) batches on Ray actors holding the model, all
writing one forecast.zarr (wxray/platform/ensemble/forecast.py, wxray/platform/cluster/replicas.py)."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from tests.forecast.forecast_helpers import TRAJECTORY_1, run_captured, save_checkpoint, write_forecast_store
from tests.mlflow_db import fresh_uri
from wxray.forecast.job import ForecastConfig, forecast
from wxray.platform.ensemble.forecast import forecast_job


@pytest.mark.slow
def test_actors_write_one_store_equal_to_the_in_process_forecast(ray_session, tmp_path, capsys):
    store = write_forecast_store(tmp_path / "odd.zarr")
    ckpt, *_ = save_checkpoint(tmp_path / "ckpt", store, "crop")
    uri = fresh_uri(tmp_path)
    argv = [f"checkpoint={ckpt}", f"tracking.uri={uri}", "members=3", "steps=2", f"inits={TRAJECTORY_1}", "seed=5",
            "batch_size=5"]
    rc, here, err = run_captured(capsys, "forecast", ForecastConfig, forecast, [*argv, f"out_dir={tmp_path / 'a'}"])
    assert rc == 0, err
    rc, there, err = run_captured(capsys, "forecast", ForecastConfig, forecast_job,
                                  [*argv, f"out_dir={tmp_path / 'b'}", "workers.actors=2", "workers.num_cpus=1"])
    assert rc == 0, err
    a, b = xr.open_zarr(here["forecast"]), xr.open_zarr(there["forecast"])
    assert a.sizes == b.sizes and b.sizes["member"] == 3 and np.isfinite(b.geopotential.values).all()
    # Each actor runs torch on one thread, this process on two: the same draws, float sums in another order.
    np.testing.assert_allclose(a.geopotential.values, b.geopotential.values, rtol=1e-5, atol=1e-3)
    assert there["rollout"]["scored_inits"] == here["rollout"]["scored_inits"] == 13


def test_more_actors_than_the_cluster_holds_is_refused_before_anything_is_written(ray_session, tmp_path, capsys):
    store = write_forecast_store(tmp_path / "odd.zarr")
    ckpt, *_ = save_checkpoint(tmp_path / "ckpt", store, "crop")
    out = tmp_path / "fc"
    rc, _, err = run_captured(capsys, "forecast", ForecastConfig, forecast_job,
                              [f"checkpoint={ckpt}", f"out_dir={out}", f"tracking.uri={fresh_uri(tmp_path)}",
                               "workers.actors=64"])
    assert rc == 2 and "actors=64" in err and "hold at most" in err and len(err.strip().splitlines()) == 1
    assert not (out / "forecast.zarr.partial").exists()


@pytest.mark.slow
def test_evaluate_blocks_on_ray_tasks_give_the_same_scorecard(ray_session, tmp_path, capsys):
    from wxray.platform.ensemble.evaluate import evaluate_job
    from wxray.verify.evaluate import EvaluateConfig

    store = write_forecast_store(tmp_path / "odd.zarr")
    ckpt, *_ = save_checkpoint(tmp_path / "ckpt", store, "crop")
    rc, fc, err = run_captured(capsys, "forecast", ForecastConfig, forecast,
                               [f"checkpoint={ckpt}", f"out_dir={tmp_path / 'fc'}", "tracking.enabled=false",
                                "members=3", "steps=2", f"inits={TRAJECTORY_1}"])
    assert rc == 0, err
    argv = [f"forecast={fc['forecast']}", f"truth={store}", "regrid=true", "n_bootstrap=100", "plots=false",
            "tracking.enabled=false", "init_block=3"]
    cards = {}
    for how in ("ray_tasks=0", "ray_tasks=2"):
        rc, _, err = run_captured(capsys, "evaluate", EvaluateConfig, evaluate_job,
                                  [*argv, how, f"out_dir={tmp_path / how}"])
        assert rc == 0, err
        cards[how] = xr.open_dataset(tmp_path / how / "scorecard.nc").load()
    a, b = cards.values()
    assert a["value"].size > 0 and a["n_init"].max() == 13
    xr.testing.assert_identical(a, b)  # 5 blocks of inits on Ray tasks: the same scorecard, to the bit
