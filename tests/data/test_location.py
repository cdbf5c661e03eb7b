"""Stores where users keep them: a zarr store in an S3 bucket (the session's loopback server), read in place."""

from __future__ import annotations

import importlib.util
import time

import numpy as np
import pytest

from wxray.data import location
from wxray.data.schema import open_stats, open_store
from wxray.data.window_data import DataConfig, prepare_windows
from wxray.data.windows import WindowReader
from wxray.errors import ConfigError, DataError
from wxray.platform.train.datasets import build_datasets


def test_locations_name_local_paths_and_urls_alike(tmp_path):
    assert location.is_remote("s3://era5/x.zarr") and location.is_remote("gs://b/k")
    assert not location.is_remote(tmp_path) and not location.is_remote(f"file://{tmp_path}")
    assert location.local_path(f"file://{tmp_path}") == tmp_path
    assert location.join("s3://era5/x.zarr/", "stats", "mean") == "s3://era5/x.zarr/stats/mean"
    assert location.join(tmp_path, "a") == str(tmp_path / "a")
    assert location.exists(f"file://{tmp_path}") and not location.exists(f"file://{tmp_path}/none")


@pytest.mark.skipif(importlib.util.find_spec("gcsfs") is not None, reason="gcsfs installed: it would go online")
def test_a_scheme_without_its_backend_names_the_package():
    with pytest.raises(ConfigError, match=r"gs://wb2/era5.zarr: reading gs:// locations needs gcsfs"):
        open_store("gs://wb2/era5.zarr")


@pytest.mark.slow
def test_a_store_in_a_bucket_reads_as_the_same_store_on_disk(s3_wave_store, wave_store):
    remote, local = open_store(s3_wave_store), open_store(wave_store)
    assert remote.geopotential.encoding.get("chunks") == local.geopotential.encoding.get("chunks")
    np.testing.assert_array_equal(remote.geopotential.values, local.geopotential.values)
    rs, ls = open_stats(s3_wave_store), open_stats(wave_store)
    np.testing.assert_array_equal(rs.std.temperature.values, ls.std.temperature.values)


@pytest.mark.slow
def test_windows_through_ray_data_from_the_bucket_equal_the_local_reader(ray_session, s3_wave_store, wave_store):
    # Ray's workers read the bucket themselves (the endpoint and credentials from their environment)
    datasets, data = build_datasets(DataConfig(store=s3_wave_store, history=2, lead_steps=1))
    assert data.spec.store == s3_wave_store
    rows = {int(r["anchor"]): r for r in datasets["val"].take_all()}
    assert sorted(rows) == sorted(data.anchors["val"].tolist()) and rows
    local = prepare_windows(DataConfig(store=str(wave_store), history=2, lead_steps=1))
    ref = WindowReader(local.spec)({"anchor": np.array(sorted(rows))})
    for i, a in enumerate(sorted(rows)):
        np.testing.assert_array_equal(rows[a]["x"], ref["x"][i])
        np.testing.assert_array_equal(rows[a]["y"], ref["y"][i])


@pytest.mark.parametrize("url, needle", [
    ("s3://era5/none.zarr", "does not exist"),
    ("s3://no-such-bucket/waves.zarr", "does not exist"),
])
def test_a_missing_bucket_or_key_is_one_line_naming_the_url(s3_wave_store, url, needle):
    with pytest.raises(DataError, match=needle) as err:
        open_store(url)
    assert url in str(err.value) and "\n" not in str(err.value)


def test_an_unreachable_endpoint_is_an_error_within_seconds(monkeypatch):
    from tests.conftest import free_port

    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    t = time.monotonic()
    with pytest.raises(DataError, match=r"store s3://era5/waves.zarr: cannot be reached") as err:
        open_store("s3://era5/waves.zarr")
    assert time.monotonic() - t < 60 and "\n" not in str(err.value)
