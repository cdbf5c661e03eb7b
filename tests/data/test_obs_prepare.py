"""prepare_obs: a user's station table -> a point stream (aliases, short names, longitude conventions, stats),
and every bad input as one error line with nothing written."""

from __future__ import annotations

import threading

import numpy as np
import pandas as pd
import pytest

from tests.data.data_helpers import JobRun
from tests.data.obs_helpers import listing
from wxray.data.obs import ObsWindowReader, make_obs_spec, open_registry
from wxray.data.obs.prepare import prepare_obs
from wxray.data.obs.windows import check_reports
from wxray.errors import DataError
from wxray.job import run_job
from wxray.prepare.obs import PrepareObsConfig, prepare_obs_main

CSV = """Station,Date,LAT,long,elev,QC,t2m,MSL,note
10001,2000-01-01T00:00Z,51.5,-0.1,35,0,280.5,101325,a
10001,2000-01-01T06:00Z,51.5,-0.1,35,0,281.5,101300,b
10002,2000-01-01T00:00Z,-33.9,-170.0,,1,290.0,100900,c
10002,2000-01-01T06:00Z,-33.9,-170.0,,0,,100950,d
10003,2000-01-01T06:00Z,10.0,359.99999,5,0,300.0,101000,e
10003,2000-01-01T18:00+06:00,10.0,359.99999,5,0,301.0,101010,f
"""


@pytest.fixture
def run(tmp_path, capsys):
    def run(*argv: str) -> JobRun:
        capsys.readouterr()
        rc = run_job("prepare_obs", PrepareObsConfig, prepare_obs_main,
                     [*argv, f"out_dir={tmp_path / 'run'}", "tracking.enabled=false"])
        cap = capsys.readouterr()
        return JobRun(rc, cap.out, cap.err)

    return run


@pytest.fixture
def csv(tmp_path):
    p = tmp_path / "synop.csv"
    p.write_text(CSV)
    return p


def test_csv_with_aliases_and_short_names(run, csv, tmp_path):
    out = tmp_path / "obs"
    r = run(f"source={csv}", f"out={out}", "stream=synop", "noise={t2m: 0.8}")
    assert r.rc == 0, r.err
    assert r.result["variables"] == ["2m_temperature", "mean_sea_level_pressure"] and r.result["n_obs"] == 6
    assert r.result["n_stations"] == 3 and r.result["max_per_step"] == 3
    s = open_registry(out).streams["synop"]
    assert s.kind == "point" and s.levels == [] and s.noise == {"2m_temperature": 0.8, "mean_sea_level_pressure": None}
    good = [280.5, 281.5, 300.0, 301.0]  # quality 0, reported
    assert s.mean["2m_temperature"] == pytest.approx(np.mean(good)) and s.std["2m_temperature"] == pytest.approx(
        np.std(good))
    df = pd.read_parquet(out / "points" / "stream=synop").sort_values("obs_id")
    assert df.station.tolist()[:3] == ["10001", "10002", "10001"]  # sorted by (time, station)
    np.testing.assert_allclose(sorted(set(df.longitude)), [0.0, 190.0, 359.9], rtol=1e-6)  # 359.99999 -> 0
    assert df.longitude.max() < 360 and str(df.time.dtype) == "datetime64[ns]"
    assert df.time.max() == pd.Timestamp("2000-01-01T12:00")  # 18:00+06:00 is 12 UTC
    assert df.quality.dtype == np.int8 and df.altitude.isna().sum() == 2
    assert df["2m_temperature"].isna().sum() == 1 and "note" not in df


def test_levels_from_parquet_extend_an_obs_dir(run, csv, tmp_path):
    out = tmp_path / "obs"
    assert run(f"source={csv}", f"out={out}", "stream=synop").rc == 0
    before = listing(out / "points" / "stream=synop")
    t = pd.to_datetime(["2000-01-01T00"] * 4 + ["2000-01-01T12"] * 2)
    pd.DataFrame({"platform": ["S1", "S1", "S2", "S2", "S1", "S1"], "valid_time": t,
                  "latitude": [1.0, 1.0, 2.0, 2.0, 1.0, 1.0], "longitude": [10.0, 10.0, 350.0, 350.0, 10.0, 10.0],
                  "level": [850, 500, 850, 500, 850, 500], "z": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
                  "t": [270.0, 250.0, 271.0, 251.0, 272.0, 252.0]}).to_parquet(tmp_path / "sondes.parquet")
    r = run(f"source={tmp_path / 'sondes.parquet'}", f"out={out}", "stream=sondes", "variables=[z]", "step_hours=12")
    assert r.rc == 0, r.err
    reg = open_registry(out)
    assert reg.names == ["synop", "sondes"] and listing(out / "points" / "stream=synop") == before
    s = reg.streams["sondes"]
    assert s.variables == ["geopotential"] and s.levels == [850, 500] and s.max_per_step == 2
    spec = make_obs_spec(out, np.timedelta64(12, "h"), streams=["sondes"])
    got = ObsWindowReader(spec)(np.array(["2000-01-01T00"], dtype="datetime64[ns]"))
    assert got["obs.sondes.mask"].shape == (1, 2, 2) and got["obs.sondes.mask"].all()
    assert got["obs.sondes.coords"][0].tolist() == [[1.0, 10.0], [2.0, 350.0]]


def _bad_csv(tmp_path, edit) -> object:
    p = tmp_path / "bad.csv"
    p.write_text(edit(CSV))
    return p


@pytest.mark.parametrize("edit, argv, needles", [
    (lambda s: s.replace("LAT,", "Y,"), [], ["bad.csv", "no latitude column", "lat, latitude"]),
    (lambda s: s.replace("Station,", "name,"), [], ["no station column", "id, station, station_id, platform"]),
    (lambda s: s.replace("2000-01-01T06:00Z,51.5", "yesterday,51.5"), [], ["column 'Date'", "'yesterday'",
                                                                           "data row 2", "not parseable"]),
    (lambda s: s.replace("-33.9", "-95.0"), [], ["column 'LAT'", "-95", "data row 3", "[-90, 90]"]),
    (lambda s: s.replace("-170.0", "400.0"), [], ["column 'long'", "400", "[-180, 360]"]),
    (lambda s: s.replace("10002,2000-01-01T06:00Z", "10001,2000-01-01T06:00Z"), [],
     ["duplicate rows for (Station=10001, Date=2000-01-01 06:00:00)", "data row 2 and data row 4"]),
    (lambda s: s.replace(",1,290.0", ",5,290.0"), [], ["column 'QC'", "[0, 2]"]),
    (lambda s: s, ["variables=[rh]"], ["no column for variable 'rh'"]),
    (lambda s: s, ["variables=[note]"], ["column 'note'", "not numeric"]),
    (lambda s: s, ["noise={rh: 1}"], ["noise.rh"]),
    (lambda s: s.replace("MSL", "2t"), [], ["'t2m' and '2t' both give variable '2m_temperature'"]),
    (lambda s: s.replace("2000-01-01T18:00+06:00", "2300-01-01T00:00"), [], ["'2300-01-01T00:00'", "data row 6",
                                                                              "1678..2261"]),
    (lambda s: s.replace(",290.0,", ",inf,"), [], ["column 't2m'", "inf (data row 3) is not finite"]),
    (lambda s: s.replace(",101010,", ",1e30,"), [], ["column 'MSL'", "1e+30 (data row 6)", "[85000, 110000]",
                                                    "bounds.mean_sea_level_pressure"]),
    (lambda s: s.replace(",281.5,", ",1e40,"), [], ["column 't2m'", "1e+40 (data row 2)", "physical bounds"]),
    (lambda s: s.replace(",281.5,", ",abc,"), [], ["column 't2m'", "'abc' (data row 2) is not a number"]),
    (lambda s: s, ["bounds={rh: [0, 1]}"], ["bounds.rh"]),
    (lambda s: s, ["bounds={t2m: [300, 200]}"], ["bounds.t2m", "lo < hi"]),
])
def test_bad_tables_fail_in_one_line_and_write_nothing(run, tmp_path, edit, argv, needles):
    src = _bad_csv(tmp_path, edit)
    out = tmp_path / "obs"
    r = run(f"source={src}", f"out={out}", "stream=synop", *argv)
    assert r.rc == 2 and r.result is None and len(r.errors) == 1 and "Traceback" not in r.err, r.err
    for n in needles:
        assert n in r.errors[0], (n, r.errors[0])
    assert not out.exists() and not (tmp_path / "run").exists()


def test_existing_stream_needs_overwrite(run, csv, tmp_path):
    out = tmp_path / "obs"
    assert run(f"source={csv}", f"out={out}", "stream=synop").rc == 0
    before = listing(out)
    r = run(f"source={csv}", f"out={out}", "stream=synop", "variables=[t2m]")
    assert r.rc == 2 and len(r.errors) == 1 and "already has a stream 'synop'" in r.errors[0]
    assert "overwrite=true" in r.errors[0] and listing(out) == before
    r = run(f"source={csv}", f"out={out}", "stream=synop", "variables=[t2m]", "overwrite=true")
    assert r.rc == 0 and open_registry(out).streams["synop"].variables == ["2m_temperature"]
    assert pd.read_parquet(out / "points" / "stream=synop").columns.tolist().count("mean_sea_level_pressure") == 0


@pytest.mark.parametrize("argv, needle", [
    (["stream=a.b"], "config key 'stream'"),
    ([], "config key 'stream' is required"),
    (["stream=x", "step_hours=0"], "config key 'step_hours' must be > 0"),
    (["stream=x", "kind=gridded"], "config key 'kind'"),
])
def test_bad_config(run, csv, tmp_path, argv, needle):
    r = run(f"source={csv}", f"out={tmp_path / 'obs'}", *argv)
    assert r.rc == 2 and len(r.errors) == 1 and needle in r.errors[0], r.err
    assert not (tmp_path / "obs").exists()


def test_unreadable_sources(run, tmp_path):
    (tmp_path / "x.xlsx").write_text("nope")
    (tmp_path / "x.parquet").write_text("nope")
    for src, needle in [("x.xlsx", "expected a .csv or .parquet"), ("x.parquet", "not a readable table"),
                        ("missing.csv", "does not exist")]:
        r = run(f"source={tmp_path / src}", f"out={tmp_path / 'obs'}", "stream=s")
        assert r.rc == 2 and len(r.errors) == 1 and needle in r.errors[0], r.err
    assert not (tmp_path / "obs").exists()


def test_bounds_are_overridable(run, csv, tmp_path):
    """A value the built-in bounds refuse enters with the user's own bounds for that variable."""
    src = _bad_csv(tmp_path, lambda s: s.replace(",281.5,", ",120.0,"))
    assert run(f"source={src}", f"out={tmp_path / 'a'}", "stream=synop").rc == 2
    r = run(f"source={src}", f"out={tmp_path / 'b'}", "stream=synop", "bounds={t2m: [100, 400]}")
    assert r.rc == 0, r.err
    assert pd.read_parquet(tmp_path / "b" / "points" / "stream=synop")["2m_temperature"].min() == 120.0


def test_a_stream_without_reports_in_the_period_is_named(run, csv, tmp_path):
    """Training on a stream that reports nowhere in the store's period would see zero observations of it."""
    out = tmp_path / "obs"
    assert run(f"source={csv}", f"out={out}", "stream=synop").rc == 0
    spec = make_obs_spec(out, np.timedelta64(6, "h"))
    check_reports(spec, np.array(["2000-01-01T06", "2000-01-02T00"], dtype="datetime64[ns]"), "the store")
    with pytest.raises(DataError, match=r"stream 'synop' of obs dir .* no reports in the period of the store "
                                        r"\(2009-12-31T18:00 .. 2010-01-02T00:00\)"):
        check_reports(spec, np.array(["2010-01-01T00", "2010-01-02T00"], dtype="datetime64[ns]"), "the store")


def test_streams_added_at_once_are_all_registered(csv, tmp_path):
    """Four streams into one obs dir from four threads at once: obs.yaml names every one (the registry lock)."""
    out = tmp_path / "obs"
    barrier = threading.Barrier(4)

    def add(name):
        barrier.wait()
        prepare_obs(csv, out, stream=name)

    threads = [threading.Thread(target=add, args=(f"s{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(open_registry(out).names) == ["s0", "s1", "s2", "s3"]
    assert sorted(p.name for p in (out / "points").iterdir()) == [f"stream=s{i}" for i in range(4)]
    assert not (out / ".obs.yaml.lock").exists()
