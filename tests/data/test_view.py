"""`jobs/prepare_data.py mode=view`: a store in the ARCO-ERA5 layout, in a bucket of the loopback S3 server, read
in place through a sidecar; it reads as the store `mode=copy` writes from the same source."""

from __future__ import annotations

import json

import numpy as np
import pytest
import xarray as xr

from tests.tiny_store import write_tiny_store
from wxray.data import location, view
from wxray.data.schema import open_stats, open_store
from wxray.data.stats import compute_stats
from wxray.data.window_data import DataConfig, prepare_windows
from wxray.data.windows import WindowReader
from wxray.job import run_job
from wxray.platform.ingest.prepare import prepare_data_main
from wxray.prepare.stores import PrepareDataConfig
from wxray.prepare.stores import prepare_data_main as local_main


@pytest.fixture(scope="module")
def arco(s3_server, tmp_path_factory):
    """(local path, URL) of one store in the ARCO-ERA5 layout: zarr v2 with consolidated metadata, one time
    step per chunk, latitude north to south, several variables with levels, a constant field; no statistics."""
    tmp = tmp_path_factory.mktemp("arco")
    write_tiny_store(tmp / "w.zarr", n_traj=1, steps=24, grid=(8, 16), levels=(500, 850))
    ds = xr.open_zarr(tmp / "w.zarr", consolidated=False).drop_vars("trajectory").isel(latitude=slice(None, None, -1))
    ds["2m_temperature"] = ds.temperature.isel(level=1, drop=True) + 1.0
    path = tmp / "arco.zarr"
    ds.drop_encoding().chunk({"time": 1}).to_zarr(path, zarr_format=2, consolidated=True)
    fs, _ = location.filesystem("s3://arco")
    fs.mkdir("arco")
    fs.put(str(path), "arco/era5.zarr", recursive=True)
    return path, "s3://arco/era5.zarr"


def _run(capsys, main, argv):
    rc = run_job("prepare_data", PrepareDataConfig, main, [*argv, "tracking.enabled=false"])
    cap = capsys.readouterr()
    lines = [ln for ln in cap.out.splitlines() if ln.startswith("RESULT ")]
    return rc, (json.loads(lines[-1][7:]) if lines else None), cap.err


@pytest.mark.slow
def test_a_view_of_a_bucket_reads_as_the_copy_of_the_same_source(arco, ray_session, tmp_path, capsys):
    local, url = arco
    pick = ["variables=[geopotential,temperature,2m_temperature]", "levels=[850]",
            "time_range=2000-01-02T00/2000-01-06T18"]
    # the sidecar in the bucket too: nothing of the view on this disk; its statistics on Ray tasks
    rc, res, err = _run(capsys, prepare_data_main, [f"source={url}", "mode=view", "out=s3://arco/views/v.zarr",
                                                    *pick, f"out_dir={tmp_path / 'run_v'}"])
    assert rc == 0, err
    assert res["source_latitude"] == "north_to_south" and res["n_times"] == 20 and res["levels"] == [850]
    rc, copy, err = _run(capsys, local_main, [f"source={local}", f"out={tmp_path / 'copy.zarr'}", *pick[:2],
                                              f"out_dir={tmp_path / 'run_c'}"])
    assert rc == 0, err
    v, c = open_store("s3://arco/views/v.zarr"), open_store(tmp_path / "copy.zarr")
    c = c.sel(time=slice("2000-01-02T00", "2000-01-06T18"))
    assert list(v.data_vars) == ["geopotential", "temperature", "2m_temperature"]
    assert v.latitude.values[0] < v.latitude.values[-1]  # south to north, as every store
    for name in v.data_vars:
        np.testing.assert_array_equal(v[name].values, c[name].values)
    # statistics of the same fields over the same times, in one streaming pass over 3 fields
    stats_c = compute_stats(c, progress=False)
    sv = open_stats("s3://arco/views/v.zarr")
    for key in ("mean", "std", "diff_std"):
        for name in v.data_vars:
            np.testing.assert_allclose(getattr(sv, key)[name].values, stats_c[key][name].values, rtol=1e-10)
    np.testing.assert_allclose(sv.climatology.temperature.values, stats_c["climatology"].temperature.values,
                               rtol=1e-6)
    # every job's windows through the view are the copy's
    cfg = dict(history=2, lead_steps=1, input_variables=["geopotential", "temperature"], levels=[850],
               train_range="2000-01-02/2000-01-04", val_range="2000-01-05/2000-01-06", test_range="")
    wv = prepare_windows(DataConfig(store="s3://arco/views/v.zarr", **cfg))
    anchors = wv.anchors["train"][:4]
    batch = WindowReader(wv.spec)({"anchor": anchors})
    assert not location.exists("s3://arco/views/v.zarr/geopotential")  # the sidecar holds no fields
    assert batch["x"].shape[1:] == (4, 8, 16) and np.isfinite(batch["x"]).all()
    assert open_store("s3://arco/views/v.zarr").attrs[view.ATTR]["source_metadata_sha256"] not in ("", "unknown")


def test_a_time_stride_reads_fewer_steps_and_keeps_one_step_tendencies(arco, tmp_path, capsys):
    local, _ = arco
    rc, res, err = _run(capsys, local_main, [f"source={local}", "mode=view", f"out={tmp_path / 'v.zarr'}",
                                             "variables=[geopotential]", "time_stride=3",
                                             f"out_dir={tmp_path / 'run'}"])
    assert rc == 0, err
    assert res["n_times"] == 24 and res["stats_steps"] == 16  # pairs (t, t+1) every 3 steps
    full = xr.open_zarr(local).geopotential
    ds = xr.open_zarr(tmp_path / "v.zarr", group="stats/diff_std", consolidated=False)
    one_step = full.diff("time").std(("time", "latitude", "longitude"))
    np.testing.assert_allclose(ds.geopotential.values, one_step.values, rtol=0.35)  # a sample of the same
    three_step = (full.isel(time=slice(3, None)).values - full.isel(time=slice(None, -3)).values).std(axis=(0, 2, 3))
    assert (ds.geopotential.values < 0.8 * three_step).all()


@pytest.mark.parametrize("argv, needle", [
    (["variables=[relative_humidity]"], "source s3://arco/era5.zarr: variable 'relative_humidity' not found"),
    (["levels=[700]"], "source s3://arco/era5.zarr: level 700 not found (levels: [500, 850])"),
    (["time_range=2010-01-01/2010-02-01"], "time_range 2010-01-01T00:00:00/2010-02-01T00:00:00 holds 0"),
    (["member=1"], "'member' and 'allow_missing' are for mode=copy"),
])
def test_a_view_of_what_the_source_lacks_is_one_line_and_writes_nothing(arco, tmp_path, capsys, argv, needle):
    _, url = arco
    rc, res, err = _run(capsys, local_main, [f"source={url}", "mode=view", f"out={tmp_path / 'v.zarr'}", *argv,
                                             f"out_dir={tmp_path / 'run'}"])
    lines = err.strip().splitlines()
    assert rc == 2 and res is None and len(lines) == 1 and needle in lines[0], err
    assert not (tmp_path / "v.zarr").exists() and not (tmp_path / "run").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".v.zarr")]


def test_a_missing_source_bucket_is_one_line(s3_server, tmp_path, capsys):
    rc, _, err = _run(capsys, local_main, ["source=s3://no-such-bucket/era5.zarr", "mode=view",
                                           f"out={tmp_path / 'v.zarr'}", f"out_dir={tmp_path / 'run'}"])
    assert rc == 2 and "source s3://no-such-bucket/era5.zarr does not exist" in err
    assert not (tmp_path / "v.zarr").exists()
