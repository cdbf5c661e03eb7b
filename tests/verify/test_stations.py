"""Station verification: bilinear interpolation to points (the baseline), pairing a station forecast with a
point stream of an obs dir, the scores, the evaluate job with stations, and its one-line errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import xarray as xr
import yaml

from tests.mlflow_db import fresh_uri
from tests.verify.conftest import make_store, run_evaluate, write_zarr
from wxray.data.schema import open_store
from wxray.errors import DataError
from wxray.verify.forecasts import persistence_forecast
from wxray.verify.station_truth import pair_with_truth, read_station_truth
from wxray.verify.stations import (
    bilinear_at_points,
    read_station_forecasts,
    station_forecasts_from_grid,
    station_report,
    station_scores,
)

T0 = np.datetime64("2020-01-01T00", "ns")
H = np.timedelta64(1, "h")


def write_stream(obs_dir: Path, obs: pd.DataFrame, name: str = "stations", variables=("2m_temperature",),
                 levels=(), extra_streams: dict | None = None) -> Path:
    """A point stream as in the contract: <obs_dir>/points/stream=<name>/day=YYYY-MM-DD/part-0.parquet + obs.yaml.
    `obs`: columns station, time, latitude, longitude, [level], the variables, [quality] (default 0)."""
    obs = obs.copy()
    obs["time"] = pd.to_datetime(obs["time"]).astype("datetime64[ns]")
    obs["obs_id"] = np.arange(len(obs), dtype=np.int64)
    obs["quality"] = obs.get("quality", pd.Series(0, index=obs.index)).astype(np.int8)
    for c in ("latitude", "longitude", *variables):
        obs[c] = obs[c].astype(np.float32)
    obs["station"] = obs["station"].astype(str)
    if levels:
        obs["level"] = obs["level"].astype(np.int32)
    for day, part in obs.groupby(obs["time"].dt.strftime("%Y-%m-%d")):
        d = obs_dir / "points" / f"stream={name}" / f"day={day}"
        d.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pandas(part.reset_index(drop=True), preserve_index=False), d / "part-0.parquet")
    entry = {"kind": "point", "path": "points", "variables": list(variables), "levels": list(levels),
             "mean": {v: 0.0 for v in variables}, "std": {v: 1.0 for v in variables},
             "noise": {v: None for v in variables}, "max_per_step": 10, "description": "test stations"}
    reg = {"version": 1, "source_store": "", "streams": {name: entry, **(extra_streams or {})}}
    (obs_dir / "obs.yaml").write_text(yaml.safe_dump(reg))
    return obs_dir


def write_forecasts(path: Path, rows: pd.DataFrame, drop: tuple[str, ...] = ()) -> str:
    rows = rows.copy()
    rows["init_time"] = pd.to_datetime(rows["init_time"]).astype("datetime64[ns]")
    rows["lead_time"] = rows["lead_time"].astype(np.int32)
    for c in ("latitude", "longitude", "value"):
        rows[c] = rows[c].astype(np.float32)
    pq.write_table(pa.Table.from_pandas(rows.drop(columns=list(drop)), preserve_index=False), path)
    return str(path)


# ---------------------------------------------------------------- bilinear

def _linear_field(lat: np.ndarray, lon: np.ndarray) -> xr.DataArray:
    """Bilinear in (latitude, longitude unwrapped to (-180, 180]) everywhere but the cell across 180 E."""
    lt = np.where(lon <= 180, lon, lon - 360)
    values = 2.0 + 0.5 * lat[:, None] + 0.1 * lt[None, :] + 0.01 * lat[:, None] * lt[None, :]
    return xr.DataArray(values, dims=("latitude", "longitude"), coords={"latitude": lat, "longitude": lon},
                        name="f")


def _expected(lat, lon):
    lat, lon = np.asarray(lat, float), np.mod(np.asarray(lon, float), 360)
    lt = np.where(lon <= 180, lon, lon - 360)
    return 2.0 + 0.5 * lat + 0.1 * lt + 0.01 * lat * lt


@pytest.mark.parametrize("descending", [False, True])
def test_bilinear_is_exact_on_a_linear_field_across_the_seam(descending):
    lat, lon = np.linspace(-80, 80, 9), np.arange(36) * 10.0  # global: 0..350
    field = _linear_field(lat, lon)
    if descending:
        field = field.isel(latitude=slice(None, None, -1))
    # between 350 E and 360 = 0 E: the seam cell, reached from either longitude convention
    plat = np.array([0.0, 15.0, -75.0, 33.3, 80.0, -12.5])
    plon = np.array([355.0, -3.0, 359.9, 0.5, 123.4, -170.0])
    out = bilinear_at_points(field.expand_dims(t=2), plat, plon)
    assert out.dims == ("t", "point") and out.sizes["point"] == plat.size
    np.testing.assert_allclose(out.isel(t=1).values, _expected(plat, plon), rtol=0, atol=1e-10)
    # A grid in (-180, 180] is the same grid: same values.
    shifted = field.assign_coords(longitude=np.where(lon >= 180, lon - 360, lon)).sortby("longitude")
    np.testing.assert_allclose(bilinear_at_points(shifted, plat, plon).values, _expected(plat, plon), atol=1e-10)
    # poleward of the outermost row: that row's values (as regrid_like does)
    pole = bilinear_at_points(field, [89.0], [20.0])
    assert float(pole[0]) == pytest.approx(_expected([80.0], [20.0])[0])


def test_bilinear_on_a_regional_box_across_0e_and_outside_points():
    lat, lon = np.linspace(-80, 80, 9), np.arange(36) * 10.0
    box = _linear_field(lat, lon).isel(longitude=[33, 34, 35, 0, 1, 2]).assign_coords(
        longitude=[-30.0, -20.0, -10.0, 0.0, 10.0, 20.0])
    plat, plon = np.array([5.0, -40.0]), np.array([355.0, 15.0])
    np.testing.assert_allclose(bilinear_at_points(box, plat, plon).values, _expected(plat, plon), atol=1e-10)
    with pytest.raises(DataError, match="1 point.s. lie outside the regional grid .*longitude 100"):
        bilinear_at_points(box, [0.0, 0.0], [0.0, 100.0])


def test_station_forecasts_from_grid_interpolates_each_channel_and_averages_members():
    lat, lon = np.linspace(-80, 80, 9), np.arange(36) * 10.0
    base = _linear_field(lat, lon)
    inits = np.array([T0, T0 + 6 * H])
    leads = np.array([6, 12], dtype="timedelta64[h]").astype("timedelta64[ns]")
    z = xr.concat([base, base + 100], dim=pd.Index([500, 850], name="level"))
    ds = xr.Dataset({
        "2m_temperature": base.expand_dims(init_time=inits, lead_time=leads, member=[0, 1]).copy()
        + xr.DataArray([-1.0, 1.0], dims="member"),  # ensemble mean = base
        "geopotential": z.expand_dims(init_time=inits, lead_time=leads).transpose("init_time", "lead_time", ...),
    })
    st = pd.DataFrame({"station": ["A", "B", "A"], "latitude": [10.0, -33.0, 10.0], "longitude": [358.0, 41.0, 358.0]})
    table = station_forecasts_from_grid(ds, st)
    assert sorted(table["variable"].unique()) == ["2m_temperature", "geopotential_500", "geopotential_850"]
    assert len(table) == 3 * 2 * 2 * 2 and set(table["lead_time"]) == {6, 12}
    want = dict(zip(["A", "B"], _expected([10.0, -33.0], [358.0, 41.0])))
    for var, offset in (("2m_temperature", 0.0), ("geopotential_500", 0.0), ("geopotential_850", 100.0)):
        sub = table[table["variable"] == var]
        np.testing.assert_allclose(sub["value"], sub["station"].map(want) + offset, atol=1e-9)
    with pytest.raises(DataError, match="station A has more than one position"):
        station_forecasts_from_grid(ds, pd.concat([st, pd.DataFrame({"station": ["A"], "latitude": [0.0],
                                                                     "longitude": [0.0]})]))


# ---------------------------------------------------------------- pairing and scores

@pytest.fixture
def tiny(tmp_path):
    """Stations A, B every 6 h over two days; B misses one report and one of A's is suspect (quality 1)."""
    times = T0 + np.arange(8) * 6 * H
    rows = []
    for s, (la, lo) in {"A": (10.0, 20.0), "B": (-5.0, 300.0)}.items():
        for k, t in enumerate(times):
            rows.append({"station": s, "time": t, "latitude": la, "longitude": lo,
                         "2m_temperature": 270.0 + k + (5 if s == "B" else 0), "quality": 0})
    obs = pd.DataFrame(rows)
    obs.loc[(obs.station == "B") & (obs.time == times[2]), "2m_temperature"] = np.nan  # not reported
    obs.loc[(obs.station == "A") & (obs.time == times[3]), "quality"] = 1  # suspect: not truth
    obs_dir = write_stream(tmp_path / "obs", obs)
    # forecast = truth + error: +1 for A, -2 for B, at inits T0, T0 + 6 h and leads 6, 12 h
    fc = []
    for s, (la, lo), err in (("A", (10.0, 20.0), 1.0), ("B", (-5.0, 300.0), -2.0)):
        for i in (0, 1):
            for lead in (6, 12):
                k = i + lead // 6
                fc.append({"init_time": times[i], "lead_time": lead, "station": s, "latitude": la, "longitude": lo,
                           "variable": "2m_temperature", "value": 270.0 + k + (5 if s == "B" else 0) + err})
    return obs_dir, write_forecasts(tmp_path / "st.parquet", pd.DataFrame(fc)), times


def test_pairing_and_scores_on_a_tiny_stream(tiny):
    obs_dir, path, times = tiny
    fc = read_station_forecasts(path)
    assert fc["lead_time"].dtype == np.int64 and fc["init_time"].dtype == "datetime64[ns]"
    truth = read_station_truth(obs_dir, "stations", times[[2, 3]])
    assert sorted(zip(truth.station, truth.valid_time)) == [("A", times[2]), ("B", times[3])]
    paired = pair_with_truth(fc, obs_dir, "stations", "st")
    # valid times: (i, lead) -> k = 1, 2, 2, 3; A drops k=3 (suspect), B drops k=2 (missing)
    assert len(paired) == 8 - 1 - 2
    assert (paired["valid_time"] == paired["init_time"] + paired["lead_time"] * H).all()
    np.testing.assert_allclose(paired["value"] - paired["truth"], np.where(paired["station"] == "A", 1.0, -2.0))
    scores = station_scores(paired)
    lead6, lead12 = (scores.sel(variable="2m_temperature", lead_time=h) for h in (6, 12))
    # lead 6 (k = 1, 2): A +1, +1 and B -2 (k=2 missing); lead 12 (k = 2, 3): A +1 (k=3 suspect), B -2 (k=3)
    assert int(lead6["count"]) == 3 and int(lead12["count"]) == 2
    assert float(lead6["rmse"]) == pytest.approx(np.sqrt((1 + 1 + 4) / 3))
    assert float(lead6["bias"]) == pytest.approx(0.0)
    assert float(lead6["mae"]) == pytest.approx(4 / 3)
    assert float(lead12["bias"]) == pytest.approx((1 - 2) / 2)
    assert float(scores["station_rmse"].sel(variable="2m_temperature", station="B")) == pytest.approx(2.0)
    assert float(scores["station_latitude"].sel(station="B")) == -5.0
    assert "rel_diff" not in scores


def test_level_streams_pair_on_channel_names(tmp_path):
    obs = pd.DataFrame({"station": ["S"] * 2, "time": [T0 + 6 * H] * 2, "latitude": [1.0] * 2,
                        "longitude": [2.0] * 2, "level": [500, 850], "geopotential": [5e4, 1.4e4]})
    obs_dir = write_stream(tmp_path / "obs", obs, name="sondes", variables=("geopotential",), levels=(500, 850))
    fc = pd.DataFrame({"init_time": [T0] * 2, "lead_time": [6, 6], "station": ["S"] * 2, "latitude": [1.0] * 2,
                       "longitude": [2.0] * 2, "variable": ["geopotential_500", "geopotential_850"],
                       "value": [5.001e4, 1.4e4]})
    paired = pair_with_truth(read_station_forecasts(write_forecasts(tmp_path / "f.parquet", fc)), obs_dir,
                             "sondes", "f")
    assert dict(zip(paired["variable"], paired["truth"])) == {"geopotential_500": 5e4, "geopotential_850": 1.4e4}
    with pytest.raises(DataError, match="variable.s. temperature_500 not observed by stream 'sondes'"):
        other = write_forecasts(tmp_path / "g.parquet", fc.assign(variable=["temperature_500", "geopotential_500"]))
        pair_with_truth(read_station_forecasts(other), obs_dir, "sondes", "g")


# ---------------------------------------------------------------- the evaluate job

@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A store, a gridded persistence forecast, stations observing the store's 2m_temperature (bilinear at their
    positions, i.e. the truth the grid holds) and a station forecast = truth + small noise (a good decoder)."""
    root = tmp_path_factory.mktemp("stations")
    store = make_store(root / "store.zarr")
    ds = open_store(store)
    inits = ds.time.values[:8]
    gridded = write_zarr(persistence_forecast(ds, inits, [6, 12]), root / "fc.zarr")
    rng = np.random.default_rng(0)
    st = pd.DataFrame({"station": [f"S{i:02d}" for i in range(12)], "latitude": rng.uniform(-70, 70, 12),
                       "longitude": rng.uniform(0, 360, 12)})
    at = bilinear_at_points(ds["2m_temperature"], st["latitude"], st["longitude"]).load()
    obs = pd.DataFrame([{"station": s.station, "time": t, "latitude": s.latitude, "longitude": s.longitude,
                         "2m_temperature": float(at.sel(time=t).isel(point=k))}
                        for t in ds.time.values[:16] for k, s in st.iterrows()])
    obs_dir = write_stream(root / "obs", obs)
    truth = obs.set_index(["station", "time"])["2m_temperature"]
    fc = pd.DataFrame([{"init_time": t, "lead_time": h, "station": s.station, "latitude": s.latitude,
                        "longitude": s.longitude, "variable": "2m_temperature",
                        "value": truth[(s.station, t + h * H)] + rng.normal(0, 0.1)}
                       for t in inits for h in (6, 12) for _, s in st.iterrows()])
    stations = write_forecasts(root / "st.parquet", fc)
    return {"root": root, "store": store, "gridded": gridded, "obs": obs_dir, "stations": stations, "fc": fc}


def test_evaluate_stations_against_the_bilinear_baseline(world, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out_dir, uri = tmp_path / "run", fresh_uri(tmp_path)
    rc, result, err = run_evaluate([f"forecast={world['gridded']}", f"truth={world['store']}",
                                    f"stations={world['stations']}", f"station_obs={world['obs']}",
                                    "station_baseline=bilinear", f"out_dir={out_dir}", f"tracking.uri={uri}",
                                    "plots=false", "variables=[2m_temperature]"], capsys)
    assert rc == 0, err
    assert "rmse.2m_temperature.6h" in result  # the gridded scorecard is still there
    block = result["stations"]
    assert block["n_pairs"] == 8 * 2 * 12 and block["n_stations"] == 12 and block["leads_h"] == [6, 12]
    t2m = block["variables"]["2m_temperature"]
    assert set(t2m) == {"rmse", "bias", "mae", "count", "baseline_rmse", "rel_diff"}
    assert t2m["count"] == {"6h": 96, "12h": 96}
    for lead in ("6h", "12h"):  # a near-perfect station forecast beats interpolated persistence
        assert t2m["rmse"][lead] < 0.2 < t2m["baseline_rmse"][lead]
        assert t2m["rel_diff"][lead] == pytest.approx(t2m["rmse"][lead] / t2m["baseline_rmse"][lead] - 1)
    assert block["mean_rel_diff.rmse"] < -0.5 and "bilinear" in block["baseline"]
    table = pd.read_csv(out_dir / "stations.csv")
    assert list(table.columns[:3]) == ["variable", "lead_hours", "count"] and len(table) == 2
    assert table["rmse"].iloc[0] == pytest.approx(t2m["rmse"]["6h"], rel=1e-5)
    # The baseline is persistence at the stations: its RMSE from the store directly.
    fc = world["fc"]
    ds = open_store(world["store"])
    f6 = fc[fc.lead_time == 6]
    st = f6.drop_duplicates("station")
    at = bilinear_at_points(ds["2m_temperature"], st["latitude"], st["longitude"]).load()
    at = at.assign_coords(point=st["station"].values)
    err6 = [float(at.sel(time=r.init_time, point=r.station)) - float(at.sel(time=r.init_time + 6 * H,
                                                                           point=r.station)) for r in f6.itertuples()]
    assert t2m["baseline_rmse"]["6h"] == pytest.approx(np.sqrt(np.mean(np.square(err6))), rel=1e-4)
    card = xr.open_dataset(out_dir / "stations.nc")
    assert card["station_rmse"].sizes["station"] == 12

    from mlflow.tracking import MlflowClient

    history = MlflowClient(tracking_uri=uri).get_metric_history(result["mlflow_run_id"], "stations/rmse/2m_temperature")
    assert sorted(m.step for m in history) == [6, 12]


def test_station_only_evaluation_with_a_station_baseline(world, tmp_path, capsys):
    other = world["fc"].assign(value=world["fc"]["value"] + 1.0)
    baseline = write_forecasts(tmp_path / "other.parquet", other)
    rc, result, err = run_evaluate([f"stations={world['stations']}", f"station_obs={world['obs']}",
                                    f"station_baseline={baseline}", f"out_dir={tmp_path / 'run'}",
                                    "tracking.enabled=false"], capsys)
    assert rc == 0, err
    assert set(result) >= {"stations", "out_dir"} and "scorecard" not in result
    t2m = result["stations"]["variables"]["2m_temperature"]
    assert t2m["baseline_rmse"]["6h"] == pytest.approx(1.0, abs=0.05)
    assert not (tmp_path / "run" / "scorecard.nc").exists() and (tmp_path / "run" / "stations.csv").is_file()
    # station_baseline=bilinear with a gridded forecast but no truth: the grid is only the baseline
    rc, result, err = run_evaluate([f"stations={world['stations']}", f"station_obs={world['obs']}",
                                    "station_baseline=bilinear", f"forecast={world['gridded']}",
                                    f"out_dir={tmp_path / 'b'}", "tracking.enabled=false"], capsys)
    assert rc == 0, err
    assert "scorecard" not in result and result["stations"]["mean_rel_diff.rmse"] < 0


def test_station_report_as_forecast_e2e_calls_it(world):
    """The platform's forecast_e2e scores its stations.parquet beside its in-memory gridded forecast."""
    logged = []

    class Tracker:
        def log_metrics(self, metrics, step=None):
            logged.append((step, metrics))

    gridded = xr.open_zarr(world["gridded"], consolidated=False)
    block = station_report(world["stations"], world["obs"], "stations", forecast=gridded, tracker=Tracker())
    t2m = block["variables"]["2m_temperature"]
    assert block["n_pairs"] == 192 and t2m["rmse"]["6h"] < t2m["baseline_rmse"]["6h"]
    assert sorted(step for step, _ in logged) == [6, 12]
    assert set(logged[0][1]) == {"stations/rmse/2m_temperature", "stations/rel_diff/2m_temperature"}
    plain = station_report(world["stations"], world["obs"], "stations")
    assert plain["baseline"] == "" and "baseline_rmse" not in plain["variables"]["2m_temperature"]


def _bad_cases(world, tmp: Path):
    fc = world["fc"]
    no_value = write_forecasts(tmp / "novalue.parquet", fc, drop=("value",))
    late = write_forecasts(tmp / "late.parquet", fc.assign(init_time=fc["init_time"] + np.timedelta64(400, "D")))
    short = write_forecasts(tmp / "short.parquet", fc.iloc[:10])
    ds = open_store(world["store"])
    few = write_zarr(persistence_forecast(ds, ds.time.values[:4], [6, 12]), tmp / "few.zarr")
    st, obs = f"stations={world['stations']}", f"station_obs={world['obs']}"
    return [
        ([f"stations={tmp / 'gone.parquet'}", obs], f"error: stations {tmp / 'gone.parquet'} does not exist"),
        ([f"stations={no_value}", obs], f"stations {no_value}: missing column(s) value (has: init_time"),
        ([st, obs, "station_stream=ships"],
         f"stream 'ships' is not in {Path(world['obs']) / 'obs.yaml'} (streams: stations)"),
        ([st, f"station_obs={tmp / 'nowhere'}"], f"obs dir {tmp / 'nowhere'} does not exist"),
        ([f"stations={late}", obs], "no (station, valid_time) pair with a good observation in stream 'stations'"),
        ([st, obs, f"station_baseline={short}"], f"station_baseline {short}: lacks 182 of the 192 scored"),
        ([st, obs, "station_baseline=bilinear", f"forecast={world['store']}"],
         f"forecast {world['store']}: no 'lead_time' dimension"),
        ([st, obs, "station_baseline=bilinear", f"forecast={few}"],
         f"station_baseline bilinear interpolation of forecast {few}: lacks 4 init_time and 0 lead_time"),
        ([st], "config key 'station_obs' is required with stations="),
        ([st, obs, "station_baseline=bilinear"], "config key 'station_baseline': bilinear interpolates"),
        ([st, obs, f"truth={world['store']}"], "config key 'truth' scores a gridded forecast"),
        ([st, obs, f"forecast={world['gridded']}"], "config key 'truth' is required"),
        ([obs, f"forecast={world['gridded']}", f"truth={world['store']}"],
         "config key 'station_obs' needs stations="),
    ]


def test_bad_station_input_is_one_line_and_writes_nothing(world, tmp_path, capsys):
    for argv, message in _bad_cases(world, tmp_path):
        out_dir = tmp_path / "run"
        rc, result, err = run_evaluate([*argv, f"out_dir={out_dir}", "tracking.enabled=false", "plots=false"], capsys)
        lines = err.strip().splitlines()
        assert rc == 2 and result is None, (argv, err)
        assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], (argv, err)
        assert not out_dir.exists(), argv
