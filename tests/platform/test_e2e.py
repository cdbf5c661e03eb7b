"""The end-to-end system on Ray: the four stages, forecast and scoring (observation windows sharded exactly once:
tests/platform/test_datasets.py)."""

from __future__ import annotations

import contextlib
import io
import json

import numpy as np
import pandas as pd
import pytest
import torch
import xarray as xr

from tests.mlflow_db import fresh_uri
from wxray.config import dump_yaml, load_config
from wxray.data import location
from wxray.data.e2e_windows import E2EReader, ObsDataConfig, prepare_e2e, time_features
from wxray.data.obs.prepare import prepare_obs
from wxray.data.schema import open_store
from wxray.errors import CheckpointError, ConfigError
from wxray.forecast.job_e2e import ForecastE2EConfig, forecast_e2e
from wxray.job import run_job
from wxray.platform.train.e2e import initial_weights, train_e2e
from wxray.platform.train.stage_config import TrainE2EConfig
from wxray.platform.train.stochastic import FinetuneStochasticConfig, finetune_stochastic
from wxray.verify.evaluate import EvaluateConfig, evaluate
from wxray.verify.variance import split_members, split_moments

TINY = ["encoder.hidden=8", "encoder.embed_dim=16", "encoder.depth=1", "encoder.num_heads=2",
        "processor.embed_dim=16", "processor.depth=3", "processor.split=[1,1,1]", "processor.num_heads=2",
        "processor.skip_channels=8", "decoder.hidden=8", "train.epochs=1", "train.max_steps_per_epoch=2",
        "train.rollout_steps=1", "data.batch_size=4", "data.read_batch_size=4"]


def _data_cfg(small_store, small_obs, **kw) -> ObsDataConfig:
    return ObsDataConfig(store=str(small_store), obs_dir=str(small_obs.obs_dir), history=1, lead_steps=1, **kw)


def test_reader_rows_join_the_state_static_fields_and_observations(small_store, small_obs):
    data = prepare_e2e(_data_cfg(small_store, small_obs), patch_size=2)
    anchors = data.windows.anchors["train"][:3]
    row = E2EReader(data.spec, data.obs)({"anchor": anchors})
    v, grid = len(data.spec.inputs), data.spec.grid
    assert row["x"].shape == (3, v, *grid) and row["y"].shape == (3, v, *grid)
    assert row["static"].shape == (3, data.n_static, *grid)
    times = open_store(small_store).time.values[anchors]
    np.testing.assert_allclose(row["static"][:, -4, 0, 0], time_features(times)[:, 0], rtol=1e-6)
    assert {f"obs.{s.name}.mask" for s in data.obs.streams} <= set(row)


def test_history_other_than_one_is_refused():
    with pytest.raises(ConfigError, match="history 1"):
        ObsDataConfig(history=2).validate()


def test_a_stream_without_reports_in_the_training_split_is_refused(small_store, tmp_path, capsys):
    """Stations of 1990 beside a store of 2000: the encoder would train with zero observations of them."""
    table = tmp_path / "old.csv"
    table.write_text("id,time,lat,lon,t2m\n1,1990-01-01T00,10,20,280\n2,1990-01-01T06,-10,200,290\n")
    assert prepare_obs(table, tmp_path / "obs", stream="synop").n_obs == 2
    rc = run_job("train_e2e", TrainE2EConfig, train_e2e,
                 ["stage=encoder", f"data.store={small_store}", f"data.obs_dir={tmp_path / 'obs'}",
                  "data.station_stream=synop", f"stages={tmp_path / 'stages'}", "tracking.enabled=false"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith(f"error: stream 'synop' of obs dir {tmp_path / 'obs'} has no reports in the "
                                      "period of the training split"), err
    assert not (tmp_path / "stages").exists()


def test_chain_without_its_earlier_stages_names_what_to_run(small_store, small_obs, tmp_path):
    cfg = TrainE2EConfig(stage="chain", data=_data_cfg(small_store, small_obs), stages=str(tmp_path / "none"))
    data = prepare_e2e(cfg.data, cfg.encoder.patch_size)
    with pytest.raises(CheckpointError, match="needs the encoder stage first.*stage=encoder"):
        initial_weights(cfg, data)


def _run(job, cfg_cls, main, argv) -> dict:
    """Run a job in this process; its RESULT (the job must succeed)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = run_job(job, cfg_cls, main, argv)
    assert rc == 0, out.getvalue()[-3000:]
    return json.loads(out.getvalue().strip().splitlines()[-1].removeprefix("RESULT "))


@pytest.fixture(scope="module")
def chain(ray_session, small_store, small_obs, tmp_path_factory):
    """The four deterministic stages, tiny, on the small sample store and its streams."""
    stages = tmp_path_factory.mktemp("e2e") / "chain"
    uri = fresh_uri(stages.parent)
    results = {}
    for stage in ("encoder", "processor", "decoder", "chain"):
        # the decoder stage kills a worker once (the loop's fault drill, as every task of it has): Ray Train
        # restarts it and the stage still finishes
        drill = ["train.fault_drill_epoch=0", "train.max_failures=1"] if stage == "decoder" else []
        results[stage] = _run("train_e2e", TrainE2EConfig, train_e2e, [
            f"stage={stage}", f"data.store={small_store}", f"data.obs_dir={small_obs.obs_dir}",
            f"stages={stages}", f"tracking.uri={uri}", "encoder.patch_size=2", "processor.patch_size=2", *TINY,
            *drill])
    return stages, uri, results


INITS = "inits=2000-01-02T00/2000-01-02T06"


@pytest.mark.slow
def test_stages_forecast_and_station_scores(chain, small_obs, tmp_path):
    stages, uri, results = chain
    report = results["encoder"]["encoder"]
    names = ["stations", "ships", "profiles", "swath_tb", "swath_wind"]
    assert set(report["denied_rmse"]) == set(names) and report["densest_stream"] in names
    assert (stages / "encoder" / "plots" / "analysis_vs_truth.png").is_file()
    assert (stages / "decoder" / ".fault_drill_done").is_file()  # killed once, restarted, finished
    dec = results["decoder"]["decoder"]
    assert set(dec["decoder_rmse"]) == {"geopotential", "u_component_of_wind", "v_component_of_wind"}
    assert set(results["chain"]["chain"]["forecast_to_persistence"]) == {
        "geopotential", "u_component_of_wind", "v_component_of_wind", "vorticity"}
    # provenance: the run's summary and every stage checkpoint name the store and each stream read
    prov = json.loads((stages / "chain" / "summary.json").read_text())["provenance"]
    assert prov["store"]["metadata_sha256"] not in ("", "unknown") and set(prov["obs_streams"]) == set(names)
    assert all(f.get("metadata_sha256") or f.get("listing_sha256") for f in prov["obs_streams"].values())
    meta = json.loads(next((stages / "chain" / "ray").rglob("meta.json")).read_text())
    assert meta["provenance"]["store"] == prov["store"] and meta["provenance"]["git"] == prov["git"]

    out = tmp_path / "fc"
    res = _run("forecast_e2e", ForecastE2EConfig, forecast_e2e,
               [f"stages={stages}", "steps=2", INITS, f"out_dir={out}", f"tracking.uri={uri}"])
    assert res["checkpoints"].keys() == {"chain", "decoder"}
    fc = xr.open_zarr(out / "forecast.zarr")
    assert list(fc.lead_time.values / np.timedelta64(1, "h")) == [0, 6, 12] and fc.sizes["init_time"] == 2
    st = pd.read_parquet(out / "stations.parquet")
    assert list(st.columns) == ["init_time", "lead_time", "station", "latitude", "longitude", "variable", "value"]
    assert sorted(st.lead_time.unique()) == [0, 6, 12] and st.value.notna().all()
    # the processor routes half its tokens at random: drawn from each init's own seed, never the global RNG, so
    # an init forecast alone (batch_size=1), after other draws, is the same
    torch.manual_seed(99)
    _run("forecast_e2e", ForecastE2EConfig, forecast_e2e,
         [f"stages={stages}", "steps=2", INITS, f"out_dir={tmp_path / 'again'}", "batch_size=1",
          "tracking.enabled=false"])
    np.testing.assert_allclose(xr.open_zarr(tmp_path / "again" / "forecast.zarr").geopotential.values,
                               fc.geopotential.values, rtol=1e-5)  # batches of 1 and 2 inits: float rounding only

    # the same inits with the densest stream denied: another analysis
    _run("forecast_e2e", ForecastE2EConfig, forecast_e2e,
         [f"stages={stages}", "steps=1", INITS, f"out_dir={tmp_path / 'd'}", "deny=[stations]",
          "tracking.enabled=false"])
    denied = xr.open_zarr(tmp_path / "d" / "forecast.zarr")
    assert not np.allclose(denied.geopotential.isel(lead_time=0), fc.geopotential.isel(lead_time=0))
    said = io.StringIO()
    with contextlib.redirect_stdout(said):  # every stream denied: it runs, and says what that means
        rc = run_job("forecast_e2e", ForecastE2EConfig, forecast_e2e,
                     [f"stages={stages}", "steps=1", INITS, f"out_dir={tmp_path / 'all'}", f"deny=[{','.join(names)}]",
                      "tracking.enabled=false"])
    assert rc == 0 and "wxray: warning: deny withholds every stream" in said.getvalue()

    res = _run("evaluate", EvaluateConfig, evaluate,
               [f"forecast={out / 'forecast.zarr'}", f"stations={out / 'stations.parquet'}",
                f"station_obs={small_obs.obs_dir}", "station_baseline=bilinear", f"out_dir={tmp_path / 'ev'}",
                "tracking.enabled=false", "plots=false"])
    assert res["stations"]["n_pairs"] > 0 and "rel_diff" in res["stations"]["variables"]["geopotential"]


@pytest.mark.slow
def test_stochastic_uplift_and_nested_members_recomputed_alone(chain, s3_server, tmp_path):
    stages, uri, _ = chain
    with pytest.raises(CheckpointError, match="stage=encoder"):  # the processor needs the stochastic encoder
        finetune_stochastic(load_config(FinetuneStochasticConfig, ["stage=processor", f"stages={stages}"]), None)
    small = ["train.epochs=1", "train.max_steps_per_epoch=2", "stochastic.members=2", "stochastic.dropout=0.2",
             "stochastic.noise_dim=4", f"stages={stages}", f"tracking.uri={uri}"]
    enc = _run("finetune_stochastic", FinetuneStochasticConfig, finetune_stochastic, ["stage=encoder", *small])
    assert enc["from"] == "chain" and enc["epochs"] == 1
    with pytest.raises(ConfigError, match=r"stochastic.leads'=1000: at lead 1000 the train split .*holds no windows"):
        finetune_stochastic(load_config(FinetuneStochasticConfig, ["stage=processor", "stochastic.leads=1000",
                                                                   f"stages={stages}"]), None)
    proc = _run("finetune_stochastic", FinetuneStochasticConfig, finetune_stochastic,
                ["stage=processor", "stochastic.leads=2", *small])
    assert set(proc["leads"]) == {"lead_1", "lead_2"}

    def ensemble(inits, out):
        _run("forecast_e2e", ForecastE2EConfig, forecast_e2e,
             [f"stages={stages}", "steps=2", inits, "members.M=2", "members.N=3", f"out_dir={tmp_path / out}",
              "batch_size=8", "tracking.enabled=false"])  # batched inits, and one alone: bit for bit (CPU)
        return xr.open_zarr(tmp_path / out / "forecast.zarr").geopotential.load()

    both = ensemble(INITS, "both")
    assert both.dims == ("init_time", "lead_time", "encoder_draw", "dropout_draw", "latitude", "longitude")
    lead0 = both.isel(lead_time=0).values
    assert (lead0 == lead0[:, :, :1]).all()  # at the analysis the dropout members are one encoder draw
    assert not np.allclose(both.isel(lead_time=1, dropout_draw=0), both.isel(lead_time=1, dropout_draw=1))
    alone = ensemble("inits=2000-01-02T06/2000-01-02T06", "alone")
    np.testing.assert_array_equal(alone.isel(init_time=0).values, both.isel(init_time=1).values)
    # both branches uplifted: the stages are a registered MLflow model, and ensembles from it are the same
    assert "mlflow_model" not in enc and proc["mlflow_model"]["name"] == "wxray-e2e"
    _run("forecast_e2e", ForecastE2EConfig, forecast_e2e,
         [f"stages={proc['mlflow_model']['uri']}", "steps=2", "inits=2000-01-02T06/2000-01-02T06", "members.M=2",
          "members.N=3", f"out_dir={tmp_path / 'registered'}", "batch_size=1", f"tracking.uri={uri}"])
    registered = xr.open_zarr(tmp_path / "registered" / "forecast.zarr").geopotential.load()
    np.testing.assert_array_equal(registered.values, alone.values)
    # the stages folder copied whole to a bucket: read from there (its configs and newest checkpoints), the same
    fs, _ = location.filesystem("s3://wxray-stages")
    fs.mkdir("wxray-stages")
    fs.put(str(stages), "wxray-stages/chain", recursive=True)
    _run("forecast_e2e", ForecastE2EConfig, forecast_e2e,
         ["stages=s3://wxray-stages/chain", "steps=2", "inits=2000-01-02T06/2000-01-02T06", "members.M=2",
          "members.N=3", f"out_dir={tmp_path / 'bucket'}", "batch_size=1", "tracking.enabled=false"])
    in_bucket = xr.open_zarr(tmp_path / "bucket" / "forecast.zarr")
    assert in_bucket.attrs["stages"] == "s3://wxray-stages/chain"
    in_bucket = in_bucket.geopotential.load()
    np.testing.assert_array_equal(in_bucket.values, alone.values)


@pytest.mark.slow
def test_dropout_calibration_sweep_scores_each_rate_by_spread_skill(chain, tmp_path):
    """jobs/sweep.py job=forecast_e2e: a trial per inference dropout rate, each an evaluated ensemble of the
    chain uplifted by the test above (its stochastic encoder; made here when this test runs alone)."""
    from wxray.tune.sweep import SweepConfig, sweep

    stages, uri, _ = chain
    if not (stages / "stochastic_encoder").exists():
        _run("finetune_stochastic", FinetuneStochasticConfig, finetune_stochastic,
             ["stage=encoder", "train.epochs=1", "train.max_steps_per_epoch=2", "stochastic.members=2",
              "stochastic.noise_dim=4", f"stages={stages}", "tracking.enabled=false"])
    # six inits: the evaluation's intervals need that many
    spec = {"job": "forecast_e2e", "overrides": {"stages": str(stages), "members.N": 2, "steps": 1,
                                                  "inits": "2000-01-01T06/2000-01-02T12"},
            "space": {"dropout": {"grid": [0.05, 0.3]}}, "metric": "ssr_distance", "scheduler": "fifo"}
    (tmp_path / "dropout.yaml").write_text(dump_yaml(spec))
    res = _run("sweep", SweepConfig, sweep, ["--config", str(tmp_path / "dropout.yaml"), f"out_dir={tmp_path / 's'}",
                                             f"tracking.uri={uri}"])
    assert res["trials"] == 2 and res["finished"] == 2 and res["best"]["dropout"] in (0.05, 0.3)
    table = pd.read_csv(res["results"])
    assert np.isfinite(table["ssr_distance"]).all() and (table["mean_ssr"] > 0).all()
    ssr = table.set_index("dropout")["mean_ssr"]
    assert ssr[0.3] > ssr[0.05]  # the rate reaches the members: more dropout, more spread
    best = load_config(ForecastE2EConfig, ["--config", res["best_config"]])
    assert best.dropout == res["best"]["dropout"] and best.members.N == 2


def test_forecast_denying_an_unknown_stream_is_one_line(tmp_path, capsys):
    rc = run_job("forecast_e2e", ForecastE2EConfig, forecast_e2e,
                 [f"stages={tmp_path / 'nothing'}", "deny=[radar]", "tracking.enabled=false"])
    assert rc == 2 and "no chain stage" in capsys.readouterr().err


def _uplifted(stages):
    """The chain's stochastic encoder (made here when the uplift test above has not run)."""
    if not (stages / "stochastic_encoder").exists():
        _run("finetune_stochastic", FinetuneStochasticConfig, finetune_stochastic,
             ["stage=encoder", "train.epochs=1", "train.max_steps_per_epoch=2", "stochastic.members=2",
              "stochastic.noise_dim=4", f"stages={stages}", "tracking.enabled=false"])


@pytest.mark.slow
def test_ensemble_and_ose_jobs_on_actors(chain, tmp_path, capsys):
    """jobs/ensemble.py with a routing level, its maps, scores and MLflow metrics; jobs/ose.py on one stream."""
    import mlflow

    from wxray.platform.ensemble.batch import EnsembleConfig, ensemble
    from wxray.platform.ensemble.ose import OSEConfig, ose

    stages, uri, _ = chain
    _uplifted(stages)
    common = [f"stages={stages}", "members.M=2", "members.N=2", "lead_steps=1", "dropout=0.2",
              "workers.actors=1"]  # one replica: the actors' own tests are in test_ensemble.py
    out = tmp_path / "ens"
    res = _run("ensemble", EnsembleConfig, ensemble, [*common, INITS, "members.R=2", f"out_dir={out}",
                                                      f"tracking.uri={uri}"])
    fc = xr.open_zarr(res["stores"]["fields"])
    assert fc.geopotential.dims[:5] == ("init_time", "lead_time", "encoder_draw", "dropout_draw", "routing_draw")
    st = xr.open_zarr(res["stores"]["stations"]).station_forecast
    assert st.sizes["station"] > 0 and bool(st.notnull().all())
    # the decoder's spread at the stations, split as on the grid: all of it the encoder's at the analysis
    station_rho = res["station_rho_drop"]
    assert set(station_rho) == set(st.station_variable.values)
    assert all(v[0] == 0.0 and 0.0 < v[1] < 1.0 for v in station_rho.values()), station_rho
    assert res["lead_hours"] == [0.0, 6.0] and res["rho_drop"]["geopotential"][0] == 0.0  # no dropout at lead 0
    assert {"ssr_enc", "ssr_drop", "ssr_route", "ssr_total", "rmse", "crps"} <= res.keys()
    maps = xr.open_zarr(out / "variance_maps.zarr")
    assert list(maps.component.values) == ["u_enc", "u_drop", "u_route", "u_total", "rho_drop"]
    assert (out / "plots" / "variance_curves.png").is_file() and list((out / "plots").glob("variance_maps_*.png"))
    client = mlflow.MlflowClient(uri)
    run = client.get_run(res["mlflow_run_id"])
    assert "ensemble/rho_drop/geopotential" in run.data.metrics
    history = client.get_metric_history(run.info.run_id, "ensemble/rho_drop/geopotential")
    assert sorted(m.step for m in history) == [0, 6]  # the step is the lead in hours, as in every job

    res_ens_stations = res["stores"]["stations"]
    # six inits: the fewest the default fixed-b intervals take
    res = _run("ose", OSEConfig, ose, [*common, "inits=2000-01-01T06/2000-01-02T12", "streams=[stations]",
                                       "members.R=2", f"out_dir={tmp_path / 'ose'}",
                                       "tracking.enabled=false", "plots=false"])
    assert res["ranking"] == ["stations"] and set(res["runs"]) == {"baseline", "stations"}
    for component in ("u_enc", "u_drop", "u_route"):  # routing a level of its own: U_drop is dropout alone
        est, lo, hi = res["changes"]["stations"][component]
        assert lo <= est <= hi and np.isfinite([est, lo, hi]).all()
    table = pd.read_csv(res["table"])
    assert set(table.component) == {"u_enc", "u_drop", "u_route"} and len(table) == 3 * 2
    # the OSE streams station moments (keep_members=false): at the init both runs share, their split is the
    # stored members' split of the ensemble run above (the same draws)
    shared = np.datetime64("2000-01-02T00")
    streamed = split_moments(xr.open_zarr(tmp_path / "ose" / "baseline" / "station_moments.zarr").sel(
        init_time=[shared]).load(), 2, 2)["station_forecast"]
    stored = split_members(xr.open_zarr(res_ens_stations).sel(init_time=[shared]).load())["station_forecast"]
    for u in ("u_enc", "u_drop", "u_route"):
        np.testing.assert_allclose(streamed[u].values, stored[u].values, rtol=1e-4, atol=1e-9)
    assert res["baseline_rho_drop"][0] == res["baseline_rho_route"][0] == 0.0  # the processor has not run yet

    # bad input: one line, exit 2, nothing written
    capsys.readouterr()
    for argv, msg in ((["members.M=1"], "members.M=1"), (["deny=[radar]"], "radar"),  # the old name still works
                      (["streams=[stations,stations]"], "named twice"),
                      (["workers.actors=64", "workers.num_cpus=3", "inits=2000-01-01T06/2000-01-02T12"], "num_cpus=3"),
                      ([], "need at least 6"),  # the test split of this store: one init, too few for the CIs
                      (["significance_method=paper"], "need at least 4"),
                      (["workers.device=cuda"], "workers.num_gpus=0"), (["workers.device=gpu"], "workers.device"),
                      (["members.N=100000000", "inits=2000-01-01T06/2000-01-02T12"], "lower members.N"),
                      (["inits=1990-01-01T00/1990-01-02T00"], "inits=")):
        bad = tmp_path / "bad"
        rc = run_job("ose", OSEConfig, ose, [*common, *argv, f"out_dir={bad}", "tracking.enabled=false"])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and msg in err[0], err
        assert not bad.exists()
    plain = tmp_path / "plain"  # the deterministic stages only: no stochastic encoder to draw from
    plain.mkdir()
    for stage in ("encoder", "processor", "decoder", "chain"):
        (plain / stage).symlink_to(stages / stage)
    rc = run_job("ensemble", EnsembleConfig, ensemble, [*common, f"stages={plain}", INITS,
                                                        f"out_dir={tmp_path / 'bad'}", "tracking.enabled=false"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "members.M=2" in err[0] and "no stochastic encoder" in err[0], err
    assert not (tmp_path / "bad").exists()
    db = tmp_path / "fx.db"  # forecast_e2e likewise refuses before it opens an MLflow run
    rc = run_job("forecast_e2e", ForecastE2EConfig, forecast_e2e,
                 [f"stages={plain}", "members.M=2", "members.N=2", "steps=1", INITS, f"out_dir={tmp_path / 'bad'}",
                  f"tracking.uri=sqlite:///{db}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "no stochastic encoder" in err[0], err
    assert not (tmp_path / "bad").exists() and not db.exists()
