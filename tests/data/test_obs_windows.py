"""ObsWindowReader: shapes, ids, masks, the window rule (t - W step, t], empty windows, max_quality, levels,
gridded 'latest valid value', day-partition pruning, and the sample streams through it."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from tests.data.obs_helpers import STEP, T0, point_stream, write_obs_dir
from wxray.data.obs import ObsWindowReader, make_obs_spec, open_registry
from wxray.data.obs.kinds.gridded import GRIDDED
from wxray.data.obs.registry import StreamInfo
from wxray.errors import DataError

H = np.timedelta64(1, "h")


def _t(hours: float) -> str:
    return str(T0 + np.timedelta64(int(hours * 3600), "s"))


@pytest.fixture(scope="module")
def obs_dir(tmp_path_factory):
    st = point_stream("st", [
        {"time": _t(-6), "station": "A", "latitude": 1.0, "longitude": 2.0, "t": 1.0},   # id 0: on the open edge
        {"time": _t(-3), "station": "A", "latitude": 1.5, "longitude": 2.5, "t": 2.0},   # id 1: previous day
        {"time": _t(0), "station": "B", "latitude": -5.0, "longitude": 300.0, "t": 3.0, "quality": 1},  # id 3
        {"time": _t(0), "station": "A", "latitude": 1.0, "longitude": 2.0, "t": np.nan},  # id 2: not reported
        {"time": _t(6), "station": "C", "latitude": 80.0, "longitude": 359.0, "t": 5.0},  # id 4
    ], ["t"])
    pr = point_stream("pr", [
        {"time": _t(0), "station": "P", "latitude": 0.0, "longitude": 0.0, "level": 850, "z": 1.0},
        {"time": _t(0), "station": "P", "latitude": 0.0, "longitude": 0.0, "level": 500, "z": 2.0},
        {"time": _t(0), "station": "Q", "latitude": 9.0, "longitude": 9.0, "level": 850, "z": 3.0},
        {"time": _t(0), "station": "Q", "latitude": 9.0, "longitude": 9.0, "level": 700, "z": 9.0},  # not a channel
    ], ["z"], levels=[850, 500])
    sw = StreamInfo("sw", GRIDDED, "sw.zarr", ["tb"], [], {"tb": 1.0}, {"tb": 2.0}, {"tb": 1.0}, 0, "",
                    np.array([-45.0, 45.0]), np.array([0.0, 90.0, 180.0, 270.0]))
    values = np.full((3, 1, 2, 4), np.nan, np.float32)
    values[0] = 1.0
    values[1, 0, 0, 0] = 2.0
    times = np.array([T0 - STEP, T0, T0 + STEP])
    root = tmp_path_factory.mktemp("windows") / "obs"
    write_obs_dir(root, [st, pr], [(sw, times, values)])
    return root


def read(obs_dir, hours, window_steps=1, max_quality=0, streams=()):
    spec = make_obs_spec(obs_dir, STEP, window_steps=window_steps, streams=streams, max_quality=max_quality)
    return ObsWindowReader(spec)(np.array([T0 + int(h * 3600) * np.timedelta64(1, "s") for h in hours]))


def test_point_window_rule_ids_and_masks(obs_dir):
    st = open_registry(obs_dir).streams["st"]
    assert st.max_per_step == 3  # (T0-6h, T0] holds ids 1, 2, 3
    out = read(obs_dir, [0, 6, 12])
    assert out["obs.st.coords"].shape == (3, 3, 2) and out["obs.st.values"].shape == (3, 3, 1)
    assert out["obs.st.mask"].shape == (3, 3, 1) and out["obs.st.id"].shape == (3, 3)
    assert out["obs.st.id"].dtype == np.int64 and all(out[k].dtype == np.float32 for k in out if "id" not in k)
    ids = out["obs.st.id"]
    # T0: (T0-6h, T0]: the observation at T0-6h is out, the one at T0 in; quality 1 dropped at max_quality=0
    assert ids[0].tolist() == [1, 2, -1]
    assert out["obs.st.mask"][0, :, 0].tolist() == [1, 0, 0]  # id 2 reported nothing
    norm = (2.0 - st.mean["t"]) / st.std["t"]
    np.testing.assert_allclose(out["obs.st.values"][0, :, 0], [norm, 0, 0], rtol=1e-6)
    np.testing.assert_allclose(out["obs.st.coords"][0], [[1.5, 2.5], [1.0, 2.0], [0, 0]])
    assert ids[1].tolist() == [4, -1, -1] and out["obs.st.coords"][1, 0].tolist() == [80.0, 359.0]
    # an empty window: everything zero, ids -1
    assert ids[2].tolist() == [-1, -1, -1]
    assert not out["obs.st.values"][2].any() and not out["obs.st.mask"][2].any() and not out["obs.st.coords"][2].any()


def test_max_quality_and_longer_windows(obs_dir):
    assert read(obs_dir, [0], max_quality=1)["obs.st.id"][0].tolist() == [1, 2, 3]
    out = read(obs_dir, [6, 0], window_steps=2)
    assert out["obs.st.id"].shape == (2, 6)
    assert out["obs.st.id"][0].tolist() == [1, 2, 4, -1, -1, -1]
    assert out["obs.st.id"][1].tolist() == [0, 1, 2, -1, -1, -1]  # (T0-12h, T0]: id 0 (T0-6h) is now in
    out = read(obs_dir, [0], window_steps=2, max_quality=2)
    assert out["obs.st.id"][0].tolist() == [0, 1, 2, 3, -1, -1]


def test_levels_become_channels_of_one_report(obs_dir):
    pr = open_registry(obs_dir).streams["pr"]
    assert pr.channels == ["z_850", "z_500"] and pr.max_per_step == 2
    out = read(obs_dir, [0], streams=["pr"])
    assert set(out) == {"obs.pr.coords", "obs.pr.values", "obs.pr.mask", "obs.pr.id"}
    assert out["obs.pr.id"][0].tolist() == [0, 3]  # the smallest obs_id of its rows on the stream's levels
    assert out["obs.pr.mask"][0].tolist() == [[1, 1], [1, 0]]
    z = lambda v: (v - pr.mean["z"]) / pr.std["z"]  # noqa: E731
    np.testing.assert_allclose(out["obs.pr.values"][0], [[z(1.0), z(2.0)], [z(3.0), 0.0]], rtol=1e-6)
    np.testing.assert_allclose(out["obs.pr.coords"][0], [[0, 0], [9, 9]])


def test_gridded_latest_valid_value_in_the_window(obs_dir):
    out = read(obs_dir, [0, 6, 12], streams=["sw"])
    v, m = out["obs.sw.values"], out["obs.sw.mask"]
    assert v.shape == m.shape == (3, 1, 2, 4)
    assert m[0, 0].tolist() == [[1, 0, 0, 0], [0, 0, 0, 0]] and v[0, 0, 0, 0] == pytest.approx(0.5)
    assert not v[1:].any() and not m[1:].any()  # a step of all-NaN and a window without steps
    out = read(obs_dir, [0], window_steps=2, streams=["sw"])
    assert out["obs.sw.mask"].all()
    expected = np.zeros((2, 4))
    expected[0, 0] = 0.5  # the newest value wins; elsewhere the older 1.0 -> (1 - 1) / 2
    np.testing.assert_allclose(out["obs.sw.values"][0, 0], expected)


def test_too_many_reports_for_max_per_step_is_an_error(obs_dir, tmp_path):
    spec = make_obs_spec(obs_dir, STEP, streams=["st"], max_quality=2)
    spec.streams[0].max_per_step = 1
    with pytest.raises(DataError, match="stream 'st'.*3 reports in the window.*max_per_step"):
        ObsWindowReader(spec)(np.array([T0]))


def test_reader_pickles_unopened_and_days_outside_the_batch_are_not_read(obs_dir, tmp_path):
    import shutil

    copy = tmp_path / "obs"
    shutil.copytree(obs_dir, copy)
    spec = make_obs_spec(copy, STEP, streams=["st", "sw"])
    reader = ObsWindowReader(spec)
    first = reader(np.array([T0]))
    again = pickle.loads(pickle.dumps(reader))
    assert reader._readers and not again._readers
    # corrupt the last day's file: a batch within the first day must not open it (partition pruning)
    last = sorted((copy / "points" / "stream=st").glob("day=*"))[-1]
    assert last.name == "day=2000-01-01"
    (last / "part-0.parquet").write_bytes(b"not parquet")
    out = ObsWindowReader(spec)(np.array([T0 - 3 * H]))
    assert out["obs.st.id"][0].tolist() == [0, 1, -1]  # (T0-9h, T0-3h]
    # the unpickled copy reopens (the first day only) and reads the same
    again.spec = spec
    second = again(np.array([T0 - 3 * H]))
    for k, v in second.items():
        np.testing.assert_array_equal(v, out[k])
    assert first["obs.st.id"][0].tolist() == [1, 2, -1]


def test_sample_streams_through_the_reader(small_obs):
    obs_dir = small_obs.obs_dir
    reg = open_registry(obs_dir)
    spec = make_obs_spec(obs_dir, STEP, window_steps=2)
    times = np.array(["2000-01-01T12", "2000-01-02T06", "2000-01-05T00"], dtype="datetime64[ns]")
    out = ObsWindowReader(spec)(times)
    for s in reg.streams.values():
        p = f"obs.{s.name}"
        if s.kind == "point":
            n = 2 * s.max_per_step
            assert out[f"{p}.coords"].shape == (3, n, 2) and out[f"{p}.id"].shape == (3, n)
            assert out[f"{p}.values"].shape == out[f"{p}.mask"].shape == (3, n, s.n_channels)
            ids = out[f"{p}.id"][0]
            assert len(set(ids[ids >= 0].tolist())) == (ids >= 0).sum() > 0
            assert np.all(out[f"{p}.mask"][0][ids < 0] == 0)
        else:
            assert out[f"{p}.values"].shape == (3, 1, 24, 48)
            assert 0 < out[f"{p}.mask"][0].mean() <= 1
        vals = out[f"{p}.values"][0][out[f"{p}.mask"][0] > 0]
        assert np.isfinite(vals).all() and abs(vals.mean()) < 1.5 and 0.2 < vals.std() < 3  # normalised
