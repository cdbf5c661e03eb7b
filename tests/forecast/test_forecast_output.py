"""forecast.zarr written as it is made (wxray/forecast/output.py): laid out first, filled batch by batch,
chunked per init, member, a few leads and one level; a stopped run continues with only the missing samples."""

from __future__ import annotations

import json

import numpy as np
import pytest
import xarray as xr
import zarr

from tests.forecast.forecast_helpers import (
    TRAJECTORY_1,
    anchors_of,
    run_captured,
    save_checkpoint,
)
from tests.mlflow_db import fresh_uri
from wxray.forecast import forecaster, output
from wxray.forecast.job import ForecastConfig, forecast
from wxray.forecast.rollout import rollout


def _argv(ckpt, out, uri, *extra):
    return [f"checkpoint={ckpt}", f"out_dir={out}", f"tracking.uri={uri}", "members=3", "steps=3",
            f"inits={TRAJECTORY_1}", "seed=5", "batch_size=4", *extra]


@pytest.mark.slow
def test_streamed_store_equals_the_rollout_and_is_chunked_for_readers(store, tmp_path, capsys):
    ckpt, model, spec = save_checkpoint(tmp_path / "ckpt", store, "crop")
    rc, res, err = run_captured(capsys, "forecast", ForecastConfig, forecast,
                                _argv(ckpt, tmp_path / "fc", fresh_uri(tmp_path)))
    assert rc == 0, err
    fc = xr.open_zarr(res["forecast"])
    whole = rollout(model, spec, anchors_of(store, fc), steps=3, seed=5, members=[0, 1, 2], batch_size=1)
    got = fc.geopotential.sel(level=500).transpose("init_time", "member", "lead_time", ...).values
    np.testing.assert_array_equal(got, whole[:, :, :, 0])
    z = zarr.open_group(res["forecast"], mode="r")["geopotential"]
    assert z.chunks == (1, 3, 1, 1, *spec.kept_grid)  # init, lead (all 3: < MAX_LEAD_CHUNK), member, level, grid
    assert fc.attrs[output.FINGERPRINT] and not (tmp_path / "fc" / output.DONE).exists()
    assert not (tmp_path / "fc" / (output.NAME + ".partial")).exists()


def test_lead_chunk_is_a_few_leads_and_whole_fields():
    class Spec:
        kept_grid = (721, 1440)  # 0.25 deg: 4.2 MB a field

    def chunk(n_leads, grid):
        Spec.kept_grid = grid
        return output.ForecastLayout(Spec(), np.zeros(1), np.arange(n_leads)).lead_chunk

    assert chunk(40, (721, 1440)) == 1  # 0.25 deg: one 4.2 MB field a chunk, a per-lead reader reads it once
    assert chunk(40, (64, 128)) == output.MAX_LEAD_CHUNK and chunk(2, (64, 128)) == 2  # small fields grouped
    assert chunk(40, (256, 512)) == 2  # 512 KB fields: two a chunk


@pytest.mark.slow
def test_a_stopped_forecast_continues_with_only_the_missing_samples(store, tmp_path, capsys, monkeypatch):
    ckpt, *_ = save_checkpoint(tmp_path / "ckpt", store, "crop")
    uri = fresh_uri(tmp_path)
    rc, whole, err = run_captured(capsys, "forecast", ForecastConfig, forecast, _argv(ckpt, tmp_path / "a", uri))
    assert rc == 0, err

    recorded = output.ForecastStore.record
    calls = {"record": 0, "batches": 0}

    def stop_after_three(self, batch):
        if calls["record"] == 3:
            raise KeyboardInterrupt  # Ctrl-C, or the node lost, after three batches are in
        calls["record"] += 1
        recorded(self, batch)

    monkeypatch.setattr(output.ForecastStore, "record", stop_after_three)
    out = tmp_path / "b"
    rc, _, err = run_captured(capsys, "forecast", ForecastConfig, forecast, _argv(ckpt, out, uri))
    assert rc != 0
    partial = out / (output.NAME + ".partial")
    done = [s for line in (out / output.DONE).read_text().splitlines()[1:] for s in json.loads(line)]
    assert partial.is_dir() and not (out / output.NAME).exists() and len(done) == 12  # 3 batches of 4
    opened = xr.open_zarr(partial)  # valid while partial: what is in is readable, the rest NaN
    assert np.isfinite(opened.geopotential.isel(init_time=0).values).all()
    assert np.isnan(opened.geopotential.isel(init_time=-1).values).all()

    with open(out / output.DONE, "a") as f:
        f.write("[[12, 0], [12")  # a line a crash cut short: its batch is made again
    monkeypatch.setattr(output.ForecastStore, "record", recorded)
    made = forecaster.BatchWriter.__call__

    def count(self, batch):
        calls["batches"] += len(batch)
        return made(self, batch)

    monkeypatch.setattr(forecaster.BatchWriter, "__call__", count)
    rc, res, err = run_captured(capsys, "forecast", ForecastConfig, forecast, _argv(ckpt, out, uri))
    assert rc == 0, err
    assert calls["batches"] == 13 * 3 - 12  # only the missing samples
    a, b = xr.open_zarr(whole["forecast"]), xr.open_zarr(res["forecast"])
    np.testing.assert_array_equal(a.geopotential.values, b.geopotential.values)  # bit for bit (CPU)
    assert res["rollout"] == whole["rollout"] and not partial.exists() and not (out / output.DONE).exists()

    calls["batches"] = 0  # the same command once more: the store is this run's, nothing is computed
    rc, _, err = run_captured(capsys, "forecast", ForecastConfig, forecast, _argv(ckpt, out, uri))
    assert rc == 0 and calls["batches"] == 0, err


def test_a_partial_store_of_other_settings_is_refused_in_one_line(store, tmp_path, capsys, monkeypatch):
    ckpt, *_ = save_checkpoint(tmp_path / "ckpt", store, "crop")
    out, uri = tmp_path / "b", fresh_uri(tmp_path)

    recorded = output.ForecastStore.record

    def stop_after_one(self, batch):
        if self.done:
            raise KeyboardInterrupt
        recorded(self, batch)

    monkeypatch.setattr(output.ForecastStore, "record", stop_after_one)
    assert run_captured(capsys, "forecast", ForecastConfig, forecast, _argv(ckpt, out, uri))[0] != 0
    assert (out / output.DONE).is_file()  # one batch was in: kept for a re-run
    monkeypatch.undo()
    rc, _, err = run_captured(capsys, "forecast", ForecastConfig, forecast, _argv(ckpt, out, uri, "seed=6"))
    assert rc != 0 and "holds a partial forecast with other settings" in err and len(err.strip().splitlines()) == 1


def test_a_failure_before_the_first_batch_is_in_leaves_nothing(store, tmp_path, capsys, monkeypatch):
    ckpt, *_ = save_checkpoint(tmp_path / "ckpt", store, "crop")

    def stop(self, batch):
        raise KeyboardInterrupt

    monkeypatch.setattr(output.ForecastStore, "record", stop)
    out = tmp_path / "fc"
    assert run_captured(capsys, "forecast", ForecastConfig, forecast, _argv(ckpt, out, fresh_uri(tmp_path)))[0] != 0
    assert not out.exists()
