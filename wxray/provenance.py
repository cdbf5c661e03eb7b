"""Provenance: what produced a run, recorded by every job (`JobContext.start`) and in every checkpoint.

    collect(seeds=...)          # git commit + dirty flag, versions, CUDA/ROCm, devices, host, Ray node types
    store_fingerprint(path)     # a store's path, a hash of its zarr metadata, time range, variables, levels
    stream_fingerprint(path)    # an observation stream's path and a hash of its metadata or file listing
    input_fingerprints(cfg)     # the same for every input path a job's config names
    tags(prov)                  # the same, small, as MLflow tags wxray.git_commit, wxray.torch, ...

Nothing here fails or waits: without git, outside a checkout (an installed copy, Ray's working-dir copy of a
submitted job) the commit is "unknown" -- or $WXRAY_GIT_COMMIT when the submitter passed it -- and git gets
a few seconds at most. Nothing imports torch or ray: their details are read when the job already loaded them.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import socket
import subprocess
import sys
import warnings
from collections import Counter
from importlib import metadata
from pathlib import Path
from typing import Any

from wxray.config import path_keys
from wxray.data import location

UNKNOWN = "unknown"
GIT_ENV = "WXRAY_GIT_COMMIT"  # the commit of a copy without .git (e.g. `ray job submit --working-dir .`)
GIT_TIMEOUT_S = 3.0
PACKAGES = ("torch", "ray", "mlflow", "xarray", "zarr", "numpy")
VENDOR_LABEL = "wxray.io/vendor"  # as cluster.yaml and cluster/slurm label the GPU nodes
TYPE_LABELS = ("wxray.io/accelerator-type", "ray.io/accelerator-type")
ZARR_METADATA = (".zgroup", ".zarray", ".zattrs", ".zmetadata", "zarr.json")


def _git(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                              timeout=GIT_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):  # no git, a hung filesystem
        return None
    return done.stdout if done.returncode == 0 else None


def git_info(root: str | Path | None = None) -> dict[str, Any]:
    """{"commit", "dirty"} of the checkout holding the wxray package (or `root`): "unknown" when it is no
    checkout of its own (an installed copy inside some other repository does not count)."""
    root = Path(root) if root is not None else Path(__file__).resolve().parent.parent
    commit = dirty = None
    if (root / ".git").exists():  # a directory, or a file for worktrees and submodules
        commit = (_git(root, "rev-parse", "HEAD") or "").strip() or None
        if commit:
            status = _git(root, "status", "--porcelain", "--untracked-files=no")
            dirty = None if status is None else bool(status.strip())
    if commit is None and os.environ.get(GIT_ENV):
        commit = os.environ[GIT_ENV].strip()
    return {"commit": commit or UNKNOWN, "dirty": UNKNOWN if dirty is None else dirty}


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        module = sys.modules.get(name)
        found = getattr(module, "__version__", None)
        if found is None:
            for dist in (name, f"{name}-skinny"):
                try:
                    found = metadata.version(dist)
                    break
                except metadata.PackageNotFoundError:
                    continue
        out[name] = str(found or UNKNOWN)
    return out


def accelerators() -> dict[str, Any]:
    """torch's CUDA / ROCm build and this process's GPUs: names only where CUDA is already initialised (a
    driver that never touches its GPUs should not create a context for this), else their count."""
    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    out: dict[str, Any] = {"cuda": torch.version.cuda, "hip": getattr(torch.version, "hip", None)}
    try:
        if torch.cuda.is_available():
            n = torch.cuda.device_count()
            out["gpus"] = n
            if torch.cuda.is_initialized():
                out["devices"] = [torch.cuda.get_device_name(i) for i in range(n)]
        else:
            out["gpus"] = 0
    except Exception:  # a broken driver must not fail the job
        out["gpus"] = UNKNOWN
    return out


def ray_nodes() -> list[dict[str, Any]] | None:
    """The alive nodes of the connected Ray cluster grouped by kind (vendor, accelerator type, CPUs, GPUs),
    None when this process has no Ray connection."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    try:
        nodes = [n for n in ray.nodes() if n.get("Alive")]
    except Exception:
        return None
    kinds: Counter = Counter()
    for n in nodes:
        res, labels = n.get("Resources") or {}, n.get("Labels") or {}
        types = {k.split(":", 1)[1] for k in res if k.startswith("accelerator_type:")}
        types |= {labels[k] for k in TYPE_LABELS if labels.get(k)}
        vendor = labels.get(VENDOR_LABEL) or next((v for v in ("nvidia", "amd") if res.get(v)), "")
        kinds[(vendor, ",".join(sorted(types)), int(res.get("CPU", 0)), int(res.get("GPU", 0)))] += 1
    return [{"count": c, "vendor": v, "accelerator_type": t, "cpus": cpu, "gpus": gpu}
            for (v, t, cpu, gpu), c in sorted(kinds.items())]


def seeds(flat_config: dict[str, Any]) -> dict[str, Any]:
    """The seed keys of a flattened config (train.seed, data.shuffle_seed, seed, ...)."""
    return {k: v for k, v in flat_config.items() if k.rsplit(".", 1)[-1].endswith("seed")}


def collect(seeds: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"git": git_info(), "versions": versions(), "host": socket.gethostname()}
    acc = accelerators()
    if acc:
        out["accelerators"] = acc
    nodes = ray_nodes()
    if nodes is not None:
        out["ray_nodes"] = nodes
    if seeds is not None:
        out["seeds"] = seeds
    return out


def _metadata_files(store: str | Path) -> list[tuple[str, bytes]]:
    """(name relative to the store, content) of every zarr metadata file of a v2 or v3 store, on disk or at a
    URL alike (one fsspec walk), not its chunks: groups are walked, arrays are not (their folders hold only
    chunks). [] when there is no store there."""
    fs, base = location.filesystem(store)
    base = base.rstrip("/")
    if not fs.isdir(base):
        return []
    found, todo = [], [base]
    while todo:
        d = todo.pop()
        entries = fs.ls(d, detail=True)
        files = {e["name"].rstrip("/").rsplit("/", 1)[-1]: e["name"] for e in entries if e["type"] == "file"}
        here = [(files[name], fs.cat_file(files[name])) for name in ZARR_METADATA if name in files]
        found += here
        meta = {name.rsplit("/", 1)[-1]: content for name, content in here}
        is_array = ".zarray" in meta
        if "zarr.json" in meta and not is_array:
            try:
                is_array = json.loads(meta["zarr.json"]).get("node_type") == "array"
            except ValueError:
                pass
        if not is_array and (here or d == base):
            todo += sorted((e["name"].rstrip("/") for e in entries if e["type"] == "directory"
                            and not e["name"].rstrip("/").rsplit("/", 1)[-1].startswith(".")), reverse=True)
    return sorted((name[len(base) + 1:], content) for name, content in found)


def metadata_hash(path: str | Path) -> str:
    """sha256 of a store's zarr metadata files (names and contents), the same on disk and at a URL; "unknown"
    when there is no store there or it cannot be read."""
    try:
        files = _metadata_files(path)
    except Exception:  # provenance never fails a job
        return UNKNOWN
    if not files:
        return UNKNOWN
    h = hashlib.sha256()
    for name, content in files:
        h.update(name.encode() + b"\0")
        h.update(content + b"\0")
    return h.hexdigest()


def store_fingerprint(path: str | Path, ds: Any = None) -> dict[str, Any]:
    """The store a job read: path, zarr metadata hash, time range, variables and levels (`ds`: the store
    already opened, else it is opened lazily here; what cannot be read is left out, never an error)."""
    out: dict[str, Any] = {"path": str(path), "metadata_sha256": metadata_hash(path)}
    try:
        if ds is None:
            import xarray as xr

            with warnings.catch_warnings():  # an unconsolidated store: xarray warns and reads it anyway
                warnings.simplefilter("ignore")
                ds = (location.open_zarr(path, consolidated=None) if location.is_remote(path)
                      else xr.open_zarr(path, consolidated=None))
        if "time" in ds.coords and ds["time"].size:
            times = ds["time"].values
            out["time_range"] = [str(times[0])[:19], str(times[-1])[:19]]
            out["times"] = int(times.size)
        out["variables"] = sorted(str(v) for v in ds.data_vars)
        if "level" in ds.coords:
            out["levels"] = [v.item() for v in ds["level"].values]
    except Exception:
        pass
    return out


def stream_fingerprint(path: str | Path) -> dict[str, Any]:
    """An observation stream's path and a hash: of its zarr metadata (a gridded stream), or of its files'
    names and sizes (a Parquet dataset: a changed or added partition changes it); "unknown" when remote."""
    root = Path(path)
    out: dict[str, Any] = {"path": str(path)}
    if location.scheme(path) or not root.exists():
        return {**out, "sha256": UNKNOWN}
    if _metadata_files(root):
        return {**out, "metadata_sha256": metadata_hash(root)}
    h, n = hashlib.sha256(), 0
    files = sorted(f for f in root.rglob("*") if f.is_file()) if root.is_dir() else [root]
    for f in files:
        try:  # a file removed while we list (a run directory being written): left out
            size = f.stat().st_size
        except OSError:
            continue
        h.update(f"{f.relative_to(root).as_posix() if root.is_dir() else f.name}\0{size}\0".encode())
        n += 1
    return {**out, "files": n, "listing_sha256": h.hexdigest()}


def input_fingerprints(cfg: Any, known: dict[str, dict[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
    """{config key: fingerprint} of every input path a job's config names (`config.InPath` keys that are set):
    a zarr store by `store_fingerprint`, anything else (a checkpoint, a Parquet dataset, a folder of runs)
    by `stream_fingerprint`; a glob or a path that is not there by its text. `known`: {path: fingerprint}
    the job took already (its store), not read again."""
    out, known = {}, known or {}
    for owner, name, key, marker in path_keys(cfg):
        value = getattr(owner, name)
        if marker.output or not value or value in marker.keywords:
            continue
        root = Path(value)
        if value in known or str(root.resolve()) in known:
            out[key] = known.get(value) or known[str(root.resolve())]
            continue
        try:
            if not location.scheme(value) and root.is_dir() and _metadata_files(root):
                out[key] = store_fingerprint(value)
            else:
                out[key] = stream_fingerprint(value)
        except OSError as e:  # provenance never fails a job
            out[key] = {"path": value, "sha256": UNKNOWN, "error": type(e).__name__}
    return out


def _nodes_text(nodes: list[dict[str, Any]]) -> str:
    parts = []
    for n in nodes:
        kind = " ".join(x for x in (n["vendor"], n["accelerator_type"]) if x) or "cpu"
        parts.append(f"{n['count']}x {kind} ({n['gpus']} GPU, {n['cpus']} CPU)")
    return "; ".join(parts)


def tags(prov: dict[str, Any]) -> dict[str, str]:
    """MLflow tags of a provenance dict: a dozen short values (the full record is provenance.json)."""
    out = {"wxray.git_commit": str(prov.get("git", {}).get("commit", UNKNOWN)),
           "wxray.git_dirty": str(prov.get("git", {}).get("dirty", UNKNOWN)).lower()}
    if prov.get("host"):
        out["wxray.host"] = str(prov["host"])
    out.update({f"wxray.{k}": str(v) for k, v in prov.get("versions", {}).items()})
    acc = prov.get("accelerators") or {}
    for k in ("cuda", "hip"):
        if acc.get(k):
            out[f"wxray.{k}"] = str(acc[k])
    if acc.get("devices"):
        out["wxray.devices"] = ", ".join(acc["devices"])[:500]
    if prov.get("ray_nodes"):
        out["wxray.ray_nodes"] = _nodes_text(prov["ray_nodes"])[:1000]
    for key, value in prov.items():  # the stores the job read: store, truth_store, ...
        if isinstance(value, dict) and "metadata_sha256" in value:
            out[f"wxray.{key}"] = str(value["path"])
            out[f"wxray.{key}_sha256"] = str(value["metadata_sha256"])
            if value.get("time_range"):
                out[f"wxray.{key}_time_range"] = "/".join(value["time_range"])
    return out
