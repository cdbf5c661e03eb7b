"""Obs dirs in object storage: `small_obs` uploaded as it is to a bucket of the loopback S3 server reads as the
same obs dir on disk (registry, point and gridded windows, end-to-end rows in this process and in Ray Data's
read tasks, the station table, station truth and scores, the evaluate job); a URL without obs.yaml or an
unreachable endpoint is one line naming it; writing a registry into a bucket is refused."""

from __future__ import annotations

import dataclasses
import pickle
import time

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import xarray as xr

from tests.conftest import free_port
from tests.data.obs_helpers import STEP
from tests.verify.conftest import run_evaluate
from wxray.data import location
from wxray.data.e2e_windows import E2EReader, ObsDataConfig, prepare_e2e
from wxray.data.obs import ObsWindowReader, make_obs_spec, open_registry
from wxray.data.obs.kinds import kind_of
from wxray.data.obs.kinds.gridded import GRIDDED
from wxray.data.obs.kinds.point import POINT
from wxray.data.obs.registry import write_registry
from wxray.data.obs.windows import count_reports
from wxray.errors import ConfigError, DataError
from wxray.forecast.chain import station_table
from wxray.platform.train.datasets import e2e_dataset
from wxray.verify.station_truth import read_station_truth
from wxray.verify.stations import station_evaluation

BUCKET = "obs-remote"
URL = f"s3://{BUCKET}/obs"
TIMES = np.array(["2000-01-01T12", "2000-01-02T06", "2000-01-05T00"], dtype="datetime64[ns]")


@pytest.fixture(scope="module")
def remote_obs(s3_server, small_obs):
    """(local obs dir, its copy at URL)."""
    fs, _ = location.filesystem(URL)
    fs.mkdir(BUCKET)
    fs.put(str(small_obs.obs_dir), f"{BUCKET}/obs", recursive=True)
    return small_obs.obs_dir, URL


def _same_stream(a, b) -> None:
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            np.testing.assert_array_equal(x, y)
        else:
            assert x == y, f.name


def test_the_registry_at_a_url_is_the_one_on_disk(remote_obs):
    local, url = remote_obs
    a, b = open_registry(local), open_registry(url + "/")  # a trailing slash is the same obs dir
    assert a.obs_dir == str(local) and b.obs_dir == url  # the scheme kept: not s3:/obs-remote/obs
    assert a.names == b.names and a.source_store == b.source_store
    assert {s.kind for s in b.streams.values()} == {POINT, GRIDDED}
    for name in a.names:
        _same_stream(a.streams[name], b.streams[name])
    st = b.streams["stations"]
    assert kind_of(st).data_path(st, url) == f"{url}/points/stream=stations"
    assert make_obs_spec(url, STEP).obs_dir == url


def test_point_and_gridded_windows_from_a_url_equal_those_on_disk(remote_obs):
    local, url = remote_obs
    specs = [make_obs_spec(p, STEP, window_steps=2) for p in (local, url)]
    a = ObsWindowReader(specs[0])(TIMES)
    reader = pickle.loads(pickle.dumps(ObsWindowReader(specs[1])))  # as a Ray task gets it: unopened
    b = reader(TIMES)
    assert sorted(a) == sorted(b) and any(k.endswith(".id") for k in a)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    assert any(b[f"obs.{s.name}.mask"].any() for s in specs[1].streams if s.kind == GRIDDED)
    lo, hi = TIMES[0] - 4 * STEP, TIMES[-1]
    for sa, sb in zip(*(s.streams for s in specs)):
        assert count_reports(specs[0], sa, lo, hi) == count_reports(specs[1], sb, lo, hi) > 0


def test_end_to_end_rows_and_station_table_from_a_url_equal_those_on_disk(remote_obs, small_store):
    datas = [prepare_e2e(ObsDataConfig(store=str(small_store), obs_dir=str(p), history=1, lead_steps=1), 2)
             for p in remote_obs]
    assert datas[1].obs.obs_dir == URL and datas[0].station_altitude == datas[1].station_altitude
    anchors = datas[0].windows.anchors["train"][:3]
    a, b = (E2EReader(d.spec, d.obs)({"anchor": anchors}) for d in datas)
    assert sorted(a) == sorted(b)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    tables = [station_table(d) for d in datas]
    pd.testing.assert_frame_equal(tables[0], tables[1])
    assert len(tables[1]) > 10


@pytest.mark.slow
def test_end_to_end_rows_through_ray_data_from_a_url_equal_the_local_reader(ray_session, remote_obs, small_store):
    # Ray's read tasks open the bucket's streams themselves (the endpoint and credentials from their environment)
    local, remote = (prepare_e2e(ObsDataConfig(store=str(small_store), obs_dir=str(p), history=1, lead_steps=1), 2)
                     for p in remote_obs)
    anchors = remote.windows.anchors["train"][:4]
    rows = {int(r["anchor"]): r for r in e2e_dataset(remote, anchors, read_batch_size=2).take_all()}
    assert sorted(rows) == sorted(anchors.tolist())
    ref = E2EReader(local.spec, local.obs)({"anchor": np.array(sorted(rows))})
    for i, a in enumerate(sorted(rows)):
        for k in ref:
            np.testing.assert_array_equal(rows[a][k], ref[k][i], err_msg=k)


@pytest.fixture(scope="module")
def forecasts(remote_obs, tmp_path_factory):
    """(path, URL) of a station forecast (truth + 1 K at 6 h lead) of every reporting station at TIMES."""
    local_obs = remote_obs[0]
    path = tmp_path_factory.mktemp("stations") / "st.parquet"
    truth = read_station_truth(local_obs, "stations", TIMES)
    pos = pq.read_table(local_obs / "points" / "stream=stations", columns=["station", "latitude", "longitude"])
    pos = pos.to_pandas().astype({"station": str}).drop_duplicates("station")
    fc = truth.merge(pos, on="station").rename(columns={"truth": "value"})
    fc = fc.assign(init_time=fc.valid_time - pd.Timedelta(hours=6), lead_time=np.int32(6), value=fc.value + 1.0)
    cols = ["init_time", "lead_time", "station", "latitude", "longitude", "variable", "value"]
    pq.write_table(pa.Table.from_pandas(fc[cols], preserve_index=False), path)
    location.put(path, f"s3://{BUCKET}/st.parquet")
    return str(path), f"s3://{BUCKET}/st.parquet"


def test_station_truth_and_scores_from_a_url_equal_those_on_disk(remote_obs, forecasts):
    local, url = remote_obs
    a, b = (read_station_truth(p, "stations", TIMES) for p in (local, url))
    pd.testing.assert_frame_equal(a, b)
    assert len(b) > 10
    on_disk = station_evaluation(forecasts[0], local, "stations")
    remote = station_evaluation(forecasts[1], url, "stations")
    xr.testing.assert_equal(on_disk, remote)
    np.testing.assert_allclose(remote["bias"].values[remote["count"].values > 0], 1.0, rtol=1e-5)
    assert remote.attrs["truth"] == f"stream stations of {url}"


def test_the_evaluate_job_scores_stations_in_a_bucket_as_on_disk(remote_obs, forecasts, tmp_path, capsys):
    blocks = []
    for (obs, st), run in zip(zip(remote_obs, forecasts), ("disk", "bucket")):
        rc, result, err = run_evaluate([f"stations={st}", f"station_obs={obs}", f"out_dir={tmp_path / run}",
                                        "tracking.enabled=false"], capsys)
        assert rc == 0, err
        blocks.append(result["stations"])
    names = ("forecast", "truth", "csv", "netcdf")
    assert blocks[1]["truth"] == f"stream stations of {URL}" and blocks[1]["forecast"] == f"stations {forecasts[1]}"
    assert {k: v for k, v in blocks[0].items() if k not in names} == {k: v for k, v in blocks[1].items()
                                                                       if k not in names}
    assert blocks[1]["n_pairs"] > 100


@pytest.mark.parametrize("call", [
    lambda u: open_registry(u),
    lambda u: make_obs_spec(u, STEP),
    lambda u: read_station_truth(u, "stations"),
], ids=["open_registry", "make_obs_spec", "read_station_truth"])
@pytest.mark.parametrize("url", [f"s3://{BUCKET}/nothing", "s3://obs-remote-no-such-bucket/obs"])
def test_a_url_without_obs_yaml_is_one_line_naming_it(remote_obs, call, url):
    with pytest.raises(DataError, match="does not exist") as err:
        call(url)
    assert url in str(err.value) and "\n" not in str(err.value)


def test_data_obs_dir_at_a_url_without_obs_yaml_is_one_line(remote_obs, small_store):
    url = f"s3://{BUCKET}/nothing"
    with pytest.raises(DataError, match=rf"data.obs_dir {url}: no obs.yaml there") as err:
        prepare_e2e(ObsDataConfig(store=str(small_store), obs_dir=url, history=1, lead_steps=1), 2)
    assert "\n" not in str(err.value)


def test_an_unreachable_endpoint_is_one_line_within_seconds(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    t = time.monotonic()
    with pytest.raises(DataError, match=rf"{URL}/obs.yaml: cannot be reached") as err:
        open_registry(URL)
    assert time.monotonic() - t < 60 and "\n" not in str(err.value)


def test_an_obs_dir_in_a_bucket_is_read_only(remote_obs):
    reg = open_registry(remote_obs[1])
    with pytest.raises(ConfigError, match=rf"obs dir {URL}: obs dirs in object storage are read-only"):
        write_registry(reg)
