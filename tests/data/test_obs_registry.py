"""obs.yaml: round trip, one-line errors naming the file and key, stream selection for the window spec."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from tests.data.obs_helpers import point_stream, write_obs_dir
from wxray.data.obs import make_obs_spec, open_registry
from wxray.data.obs.kinds.gridded import GRIDDED
from wxray.data.obs.registry import REGISTRY, StreamInfo
from wxray.errors import ConfigError, DataError

ROWS = [{"time": "2000-01-01T06", "station": "A", "latitude": 10.0, "longitude": 20.0, "t": 280.0, "p": 1e5},
        {"time": "2000-01-01T06", "station": "B", "latitude": -10.0, "longitude": 200.0, "t": 290.0, "p": 1.01e5},
        {"time": "2000-01-01T12", "station": "A", "latitude": 10.0, "longitude": 20.0, "t": 281.0, "p": 1.02e5}]


@pytest.fixture
def obs_dir(tmp_path):
    st, table = point_stream("stations", ROWS, ["t", "p"], description="two stations")
    st.noise = {"t": 0.5, "p": None}
    lat, lon = np.array([-45.0, 45.0]), np.array([0.0, 90.0, 180.0, 270.0])
    sw = StreamInfo("swath", GRIDDED, "swath.zarr", ["tb"], [], {"tb": 250.0}, {"tb": 10.0}, {"tb": 1.0}, 0,
                    "a swath", lat, lon)
    times = np.array(["2000-01-01T06", "2000-01-01T12"], dtype="datetime64[ns]")
    values = np.full((2, 1, 2, 4), np.nan, np.float32)
    write_obs_dir(tmp_path / "obs", [(st, table)], [(sw, times, values)])
    return tmp_path / "obs"


def test_round_trip(obs_dir):
    reg = open_registry(obs_dir)
    assert reg.names == ["stations", "swath"] and reg.source_store == "" and reg.version == 1
    st, sw = reg.streams["stations"], reg.streams["swath"]
    assert st.kind == "point" and st.path == "points" and st.variables == ["t", "p"] and st.levels == []
    assert st.mean["t"] == pytest.approx(283.6666667) and st.std["p"] > 0
    assert st.noise == {"t": 0.5, "p": None} and st.max_per_step == 2 and st.description == "two stations"
    assert st.channels == ["t", "p"] and st.latitude is None
    assert sw.kind == "gridded" and sw.channels == ["tb"]
    np.testing.assert_array_equal(sw.latitude, [-45.0, 45.0])
    np.testing.assert_array_equal(sw.longitude, [0.0, 90.0, 180.0, 270.0])
    # written again, the file is the same
    text = (obs_dir / REGISTRY).read_text()
    from wxray.data.obs.registry import write_registry

    write_registry(reg)
    assert (obs_dir / REGISTRY).read_text() == text


def test_level_channels_are_variable_major():
    s = StreamInfo("p", "point", "points", ["z", "t"], [850, 500], {"z": 1.0, "t": 2.0}, {"z": 3.0, "t": 4.0})
    assert s.channels == ["z_850", "z_500", "t_850", "t_500"]
    mean, std = s.channel_stats()
    assert mean.tolist() == [1, 1, 2, 2] and std.tolist() == [3, 3, 4, 4]


def _edit(obs_dir, fn):
    f = obs_dir / REGISTRY
    doc = yaml.safe_load(f.read_text())
    fn(doc)
    f.write_text(yaml.safe_dump(doc, sort_keys=False))


@pytest.mark.parametrize("edit, key", [
    (lambda d: d.update(version=2), "version"),
    (lambda d: d.pop("streams"), "streams"),
    (lambda d: d.update(extra=1), "extra"),
    (lambda d: d["streams"]["stations"].update(kind="swath"), "streams.stations.kind"),
    (lambda d: d["streams"]["stations"].update(variables=[]), "streams.stations.variables"),
    (lambda d: d["streams"]["stations"].update(levels=[0]), "streams.stations.levels"),
    (lambda d: d["streams"]["stations"]["std"].update(t=0.0), "streams.stations.std.t"),
    (lambda d: d["streams"]["stations"]["mean"].pop("p"), "streams.stations.mean.p"),
    (lambda d: d["streams"]["stations"]["mean"].update(q=1.0), "streams.stations.mean.q"),
    (lambda d: d["streams"]["stations"]["noise"].update(t=-1.0), "streams.stations.noise.t"),
    (lambda d: d["streams"]["stations"].update(max_per_step=0), "streams.stations.max_per_step"),
    (lambda d: d["streams"]["stations"].update(max_per_step="many"), "streams.stations.max_per_step"),
    (lambda d: d["streams"]["stations"].update(path="/abs"), "streams.stations.path"),
    (lambda d: d["streams"]["stations"].update(colour="red"), "streams.stations.colour"),
    (lambda d: d["streams"].update({"a.b": d["streams"]["stations"]}), "a.b"),
    (lambda d: d["streams"]["swath"].update(path="gone.zarr"), "gone.zarr"),
    (lambda d: d["streams"]["swath"].update(variables=["rain"]), "rain"),
])
def test_malformed_registry_is_one_line_naming_file_and_key(obs_dir, edit, key):
    _edit(obs_dir, edit)
    with pytest.raises(DataError) as e:
        open_registry(obs_dir)
    msg = str(e.value)
    assert str(obs_dir / REGISTRY) in msg and key in msg and "\n" not in msg, msg


def test_unreadable_or_missing_registry(obs_dir, tmp_path):
    (obs_dir / REGISTRY).write_text("streams: [unclosed\n")
    with pytest.raises(DataError, match="not readable YAML"):
        open_registry(obs_dir)
    with pytest.raises(DataError, match="does not exist"):
        open_registry(tmp_path / "nowhere")


def test_obs_spec_selects_streams_in_registry_order(obs_dir):
    spec = make_obs_spec(obs_dir, np.timedelta64(6, "h"), window_steps=2, streams=["swath", "stations"])
    assert [s.name for s in spec.streams] == ["stations", "swath"]
    assert spec.step == np.timedelta64(6 * 3600 * 10**9, "ns") and spec.window == np.timedelta64(12, "h")
    assert [s.name for s in make_obs_spec(obs_dir, "6h").streams] == ["stations", "swath"]
    with pytest.raises(ConfigError, match="stream 'ships' is not in .*streams: stations, swath"):
        make_obs_spec(obs_dir, np.timedelta64(6, "h"), streams=["ships"])
    with pytest.raises(ConfigError, match="window_steps"):
        make_obs_spec(obs_dir, np.timedelta64(6, "h"), window_steps=0)
    with pytest.raises(ConfigError, match="max_quality"):
        make_obs_spec(obs_dir, np.timedelta64(6, "h"), max_quality=3)
