"""wxray.provenance: git commit without a checkout or git, store fingerprints, Ray node kinds, MLflow tags."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from types import SimpleNamespace

import numpy as np
import xarray as xr
import zarr

from tests.tiny_store import write_tiny_store
from wxray import provenance


def _git(repo, *args):
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                   capture_output=True)


def test_git_commit_and_dirty_flag_of_a_checkout(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / "f.py").write_text("a = 1\n")
    _git(tmp_path, "add", "f.py")
    _git(tmp_path, "commit", "-q", "-m", "x")
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    assert provenance.git_info(tmp_path) == {"commit": head, "dirty": False}
    (tmp_path / "f.py").write_text("a = 2\n")
    assert provenance.git_info(tmp_path) == {"commit": head, "dirty": True}
    (tmp_path / "f.py").write_text("a = 1\n")
    (tmp_path / "new.txt").write_text("untracked files do not make it dirty")
    assert provenance.git_info(tmp_path)["dirty"] is False


def test_no_checkout_or_no_git_is_unknown_never_an_error(tmp_path, monkeypatch):
    monkeypatch.delenv(provenance.GIT_ENV, raising=False)
    # an installed copy or Ray's working-dir copy: no .git of its own, even inside some other repository
    _git(tmp_path, "init", "-q")
    (tmp_path / "site-packages").mkdir()
    assert provenance.git_info(tmp_path / "site-packages") == {"commit": "unknown", "dirty": "unknown"}
    monkeypatch.setenv(provenance.GIT_ENV, "abc123")  # passed by the submitter (README: ray job submit)
    assert provenance.git_info(tmp_path / "site-packages") == {"commit": "abc123", "dirty": "unknown"}
    monkeypatch.delenv(provenance.GIT_ENV)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no git at all
    t0 = time.monotonic()
    assert provenance.git_info(tmp_path) == {"commit": "unknown", "dirty": "unknown"}
    assert time.monotonic() - t0 < 2


def test_collect_lists_versions_seeds_and_host():
    prov = provenance.collect(seeds=provenance.seeds({"train.seed": 3, "data.shuffle_seed": 1, "x": 2}))
    assert set(prov["versions"]) == {"python", *provenance.PACKAGES}
    assert prov["versions"]["mlflow"] != "unknown" and prov["versions"]["zarr"] != "unknown"
    assert prov["seeds"] == {"train.seed": 3, "data.shuffle_seed": 1}
    assert prov["host"] and set(prov["git"]) == {"commit", "dirty"}
    if "torch" in sys.modules:
        assert {"cuda", "hip", "gpus"} <= set(prov["accelerators"])
    json.dumps(prov)  # what provenance.json, checkpoints and Ray's loop config carry


def test_ray_nodes_are_grouped_by_vendor_and_accelerator_type(monkeypatch):
    def node(alive=True, labels=None, **res):
        return {"Alive": alive, "Labels": labels or {}, "Resources": res}

    nodes = [node(CPU=8.0),
             node(labels={"wxray.io/vendor": "nvidia"}, CPU=64.0, GPU=8.0, **{"accelerator_type:H100": 1.0}),
             node(labels={"wxray.io/vendor": "nvidia"}, CPU=64.0, GPU=8.0, **{"accelerator_type:H100": 1.0}),
             node(CPU=128.0, GPU=8.0, amd=8.0, **{"accelerator_type:AMD-Instinct-MI250X": 1.0}),
             node(alive=False, CPU=4.0)]
    fake = SimpleNamespace(is_initialized=lambda: True, nodes=lambda: nodes)
    monkeypatch.setitem(sys.modules, "ray", fake)
    got = provenance.ray_nodes()
    assert got == [{"count": 1, "vendor": "", "accelerator_type": "", "cpus": 8, "gpus": 0},
                   {"count": 1, "vendor": "amd", "accelerator_type": "AMD-Instinct-MI250X", "cpus": 128, "gpus": 8},
                   {"count": 2, "vendor": "nvidia", "accelerator_type": "H100", "cpus": 64, "gpus": 8}]
    tags = provenance.tags({**provenance.collect(), "store": {"path": "/s.zarr", "metadata_sha256": "ab",
                                                              "time_range": ["2000-01-01", "2000-02-01"]}})
    assert tags["wxray.ray_nodes"] == ("1x cpu (0 GPU, 8 CPU); 1x amd AMD-Instinct-MI250X (8 GPU, 128 CPU); "
                                       "2x nvidia H100 (8 GPU, 64 CPU)")
    assert tags["wxray.store"] == "/s.zarr" and tags["wxray.store_sha256"] == "ab"
    assert tags["wxray.store_time_range"] == "2000-01-01/2000-02-01"
    assert {"wxray.git_commit", "wxray.git_dirty", "wxray.torch", "wxray.ray", "wxray.host"} <= set(tags)
    assert len(tags) < 25 and all(isinstance(v, str) for v in tags.values())
    monkeypatch.setitem(sys.modules, "ray", SimpleNamespace(is_initialized=lambda: False))
    assert provenance.ray_nodes() is None and "ray_nodes" not in provenance.collect()


def test_store_fingerprint_hashes_metadata_not_chunks(tmp_path):
    path = tmp_path / "s.zarr"
    write_tiny_store(path, n_traj=1, steps=4, grid=(4, 8), levels=(500, 850))
    fp = provenance.store_fingerprint(path)
    assert fp["path"] == str(path) and len(fp["metadata_sha256"]) == 64
    assert fp["time_range"] == ["2000-01-01T00:00:00", "2000-01-01T18:00:00"] and fp["times"] == 4
    assert fp["variables"] == ["geopotential", "land_sea_mask", "temperature"] and fp["levels"] == [500, 850]
    files = [name for name, _ in provenance._metadata_files(path)]
    assert "zarr.json" in files and "temperature/zarr.json" in files and "stats/mean/zarr.json" in files
    assert not any("/c/" in f or f.startswith("c/") for f in files), files
    chunk = next(p for p in (path / "temperature" / "c").rglob("*") if p.is_file())
    chunk.write_bytes(b"other data, same metadata")
    assert provenance.store_fingerprint(path)["metadata_sha256"] == fp["metadata_sha256"]
    zarr.open_group(path, mode="r+").attrs["source"] = "ERA5"  # metadata changed: another store
    assert provenance.store_fingerprint(path)["metadata_sha256"] != fp["metadata_sha256"]


def test_store_fingerprint_of_a_v2_store_and_of_what_cannot_be_read(tmp_path):
    v2 = tmp_path / "v2.zarr"
    xr.Dataset({"t": (("time", "x"), np.zeros((3, 2)))},
               coords={"time": np.arange(3).astype("datetime64[D]")}).to_zarr(v2, zarr_format=2, consolidated=True)
    files = {name for name, _ in provenance._metadata_files(v2)}
    assert {".zgroup", ".zmetadata", "t/.zarray", "t/.zattrs"} <= files and "t/0.0" not in files
    assert provenance.store_fingerprint(v2)["time_range"] == ["1970-01-01T00:00:00", "1970-01-03T00:00:00"]
    assert provenance.store_fingerprint("gs://bucket/era5.zarr")["metadata_sha256"] == "unknown"
    assert provenance.store_fingerprint(tmp_path / "nope.zarr") == {"path": str(tmp_path / "nope.zarr"),
                                                                    "metadata_sha256": "unknown"}


def test_a_store_in_a_bucket_has_the_fingerprint_of_the_same_store_on_disk(s3_server, tmp_path):
    from wxray.data import location

    path = tmp_path / "s.zarr"
    write_tiny_store(path, n_traj=1, steps=4, grid=(4, 8), levels=(500,))
    fs, _ = location.filesystem("s3://prov")
    fs.mkdir("prov")
    fs.put(str(path), "prov/s.zarr", recursive=True)
    local, remote = provenance.store_fingerprint(path), provenance.store_fingerprint("s3://prov/s.zarr")
    assert len(local["metadata_sha256"]) == 64
    assert {**remote, "path": str(path)} == local
    assert provenance.store_fingerprint("s3://prov/none.zarr")["metadata_sha256"] == "unknown"


def test_every_input_path_of_a_config_is_fingerprinted(tmp_path):
    from wxray.verify.evaluate import EvaluateConfig

    store = tmp_path / "truth.zarr"
    write_tiny_store(store, n_traj=1, steps=4, grid=(4, 8), levels=(500,))
    obs = tmp_path / "points" / "stream=stations"
    obs.mkdir(parents=True)
    (obs / "part-0.parquet").write_bytes(b"x" * 10)
    cfg = EvaluateConfig(forecast=str(store), truth=str(store), station_obs=str(tmp_path / "points"),
                         stations=str(tmp_path / "missing.parquet"))
    fp = provenance.input_fingerprints(cfg)
    assert fp["forecast"] == fp["truth"] == provenance.store_fingerprint(store)  # a store: its metadata
    assert fp["station_obs"]["files"] == 1 and len(fp["station_obs"]["listing_sha256"]) == 64
    before = fp["station_obs"]["listing_sha256"]
    (obs / "part-1.parquet").write_bytes(b"y")  # a partition added: another dataset
    assert provenance.input_fingerprints(cfg)["station_obs"]["listing_sha256"] != before
    assert fp["stations"] == {"path": str(tmp_path / "missing.parquet"), "sha256": "unknown"}
    assert "out_dir" not in fp  # outputs are not inputs
