"""Checkpoints: one `state.pt` (loaded with `torch.load(weights_only=True)`) + `meta.json` per directory.

The state holds model and optimiser state, the position in the data and the LR schedule
(`next_epoch`, global `step`, `samples_seen`) and the torch RNG state. Both files count epochs the same
way: `next_epoch` in the state and `epoch` in meta.json are the number of epochs completed, which is the
0-based index of the epoch a resumed run trains first (`resume_epoch`).

`meta.json` names the format and the model config, so a foreign or mismatched checkpoint is a one-line
`CheckpointError` rather than a shape error deep inside `load_state_dict`; it also keeps the data config
and the normalisation the model was trained with (`normalisation`: channel names beside their mean/std
vectors), so a forecast from another store normalises as training did, and the run's `provenance` (git
commit, versions, the training store's fingerprint, seeds: wxray.provenance). Checkpoints written before a key
existed stay readable (`meta_model`, `resume_epoch`, `meta_provenance`; `apply_normalisation` returns None).
"""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from wxray.data import location
from wxray.data.windows import WindowSpec
from wxray.errors import CheckpointError

FORMAT = "wxray-train-checkpoint-v1"
STATE, META = "state.pt", "meta.json"


def save(directory: str | Path, state: dict[str, Any], meta: dict[str, Any]) -> Path:
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    torch.save(state, d / STATE)
    (d / META).write_text(json.dumps({"format": FORMAT, **meta}, indent=2, sort_keys=True, default=str))
    return d


# Model keys added after checkpoints were first written, with the value the code of that time used.
_MODEL_KEYS_ADDED = {"pos_embed": "fixed"}  # written before model.pos_embed: the fixed sin-cos table


def meta_model(meta: dict[str, Any]) -> dict[str, Any]:
    """The model config a checkpoint was trained with, as meta.json records it, completed with the value an
    older writer implied for each key added since (`_MODEL_KEYS_ADDED`); {} when meta.json has none."""
    model = dict(meta.get("model") or {})
    if model:
        for key, then in _MODEL_KEYS_ADDED.items():
            model.setdefault(key, then)
    return model


PROVENANCE = "provenance"  # meta.json: what produced the checkpoint (wxray.provenance.collect + store)


def meta_provenance(meta: dict[str, Any]) -> dict[str, Any]:
    """The provenance meta.json records; {} for checkpoints written before it did."""
    return dict(meta.get(PROVENANCE) or {})


NORMALISATION = "normalisation"
# meta.json's `normalisation`: the spec's channel names (key) and the WindowSpec vectors that go with them.
_VECTORS = {"inputs": ("in_mean", "in_std"), "targets": ("out_mean", "out_std"),
            "constants": ("const_mean", "const_std")}


def _names(spec: WindowSpec, key: str) -> list[str]:
    return list(spec.constants) if key == "constants" else [c.name for c in getattr(spec, key)]


def normalisation_meta(spec: WindowSpec) -> dict[str, list]:
    """The normalisation of `spec` as meta.json keeps it. float32 values are written as the doubles they
    are, so `apply_normalisation` reads them back bit for bit."""
    out: dict[str, list] = {}
    for key, vectors in _VECTORS.items():
        out[key] = _names(spec, key)
        out.update({v: np.asarray(getattr(spec, v), np.float32).tolist() for v in vectors})
    return out


def apply_normalisation(spec: WindowSpec, meta: dict[str, Any], where: str | Path) -> WindowSpec | None:
    """`spec` with the normalisation its checkpoint was trained with, or None when meta.json predates
    `normalisation`. The channels of `spec` must be the checkpoint's, in its order (CheckpointError)."""
    saved = meta.get(NORMALISATION)
    if saved is None:
        return None
    new = {}
    for key, vectors in _VECTORS.items():
        have = _names(spec, key)
        if saved.get(key) != have:
            raise CheckpointError(f"checkpoint {where}: {META} normalises {key} {saved.get(key)}, the store has "
                                  f"{have}")
        for v in vectors:
            values = np.asarray(saved.get(v, ()), np.float32)
            if values.shape != (len(have),):
                raise CheckpointError(f"checkpoint {where}: {META} normalisation.{v} has {values.size} values, "
                                      f"expected one per {key[:-1]} ({len(have)})")
            new[v] = values
    return replace(spec, **new)


def resume_epoch(state: dict[str, Any], where: str | Path) -> int:
    """The 0-based epoch a run resumed from `state` trains first: its `next_epoch`, or for checkpoints
    written before that key, their `epoch` (the index of the last epoch trained) + 1."""
    if "next_epoch" in state:
        return int(state["next_epoch"])
    if "epoch" in state:
        return int(state["epoch"]) + 1
    raise CheckpointError(f"checkpoint {where}/{STATE}: no 'next_epoch' (expected a training checkpoint to resume)")


def _shown(path: str | Path, local: Path) -> str:
    """How errors name a checkpoint: its URL when fetched, else its directory."""
    return str(path).rstrip("/").removesuffix("/" + STATE) if location.is_remote(path) else str(local)


def read_meta(path: str | Path, expect_model: dict[str, Any] | None = None) -> dict[str, Any]:
    """Check a checkpoint's format and, optionally, that it was written by the same model; cheap (no weights
    locally; a checkpoint at a URL is fetched)."""
    p = fetch(path)
    d = p if p.is_dir() else p.parent
    shown = _shown(path, d)
    if not (d / STATE).is_file():
        raise CheckpointError(f"checkpoint {shown}: no {STATE} found (expected a wxray checkpoint directory)")
    try:
        meta = json.loads((d / META).read_text())
    except (OSError, ValueError):
        raise CheckpointError(f"checkpoint {shown}: missing or unreadable {META} (not a wxray checkpoint?)") from None
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {shown}: format {meta.get('format')!r}, expected {FORMAT!r}")
    if expect_model is not None:
        theirs = meta_model(meta)
        diff = [k for k in ("name", "patch_size", "embed_dim", "depth", "num_heads", "mlp_ratio", "skip_channels",
                            "local_condition", "pos_embed")
                if k in theirs and k in expect_model and theirs[k] != expect_model[k]]
        if theirs.get("channels") is not None and expect_model.get("channels") is not None \
                and theirs["channels"] != expect_model["channels"]:
            diff.append("channels")
        if diff:
            k = diff[0]
            raise CheckpointError(f"checkpoint {shown}: model.{k}={theirs.get(k)!r} does not match this run's "
                                  f"{expect_model.get(k)!r}")
    return meta


def load(path: str | Path, expect_model: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Load a checkpoint directory (or its state.pt); check format and, optionally, the model config."""
    meta = read_meta(path, expect_model)
    p = fetch(path)
    d = p if p.is_dir() else p.parent
    shown = _shown(path, d)
    try:
        state = torch.load(d / STATE, map_location="cpu", weights_only=True)
    except Exception as e:
        raise CheckpointError(f"checkpoint {shown}/{STATE} is corrupt or not a weights-only torch file "
                              f"({type(e).__name__})") from None
    if not isinstance(state, dict) or "model" not in state:
        raise CheckpointError(f"checkpoint {shown}/{STATE}: expected a dict with a 'model' entry")
    return state, meta


def latest(directory: str | Path) -> Path | str | None:
    """The newest checkpoint Ray Train wrote under `directory` (its storage path, a local folder or a URL),
    if any. Remote checkpoints are ordered by name: Ray Train names them by their UTC time."""
    if location.is_remote(directory):
        found = sorted(location.glob(directory, "**/checkpoint_*/" + META))
        return found[-1].rsplit("/", 1)[0] if found else None
    found = sorted(Path(directory).glob("**/checkpoint_*/" + META), key=lambda m: m.stat().st_mtime)
    return found[-1].parent if found else None


def prune(directory: str | Path, keep: int) -> list[str]:
    """Remove all but the `keep` checkpoints with the latest steps under `directory` (a run's storage path,
    local or a URL); the removed ones. Ray Train keeps `num_to_keep` of those it registered, but after a hard
    abort it has not registered the last ones written, which it then never removes."""
    metas = location.glob(directory, "**/checkpoint_*/" + META)
    if len(metas) <= keep:  # the usual case after every run: one listing, no reads
        return []
    found = []
    for meta in metas:
        try:
            step = int(json.loads(location.read_text(meta)).get("step", -1))
        except (OSError, ValueError):
            continue  # one being written, or not ours
        found.append((step, meta.rsplit("/", 1)[0] if location.is_remote(meta) else str(Path(meta).parent)))
    gone = [d for _, d in sorted(found, reverse=True)[keep:]]
    for d in gone:
        location.remove(d)
    return gone


_fetched: dict[str, Path] = {}


def fetch(path: str | Path) -> Path:
    """A local checkpoint directory for `path`: itself, or for a URL its state.pt and meta.json copied into
    a temporary folder removed when the process ends (fetched once per process)."""
    if not location.is_remote(path):
        return Path(path)
    url = str(path).rstrip("/")
    if url.endswith("/" + STATE):
        url = url.rsplit("/", 1)[0]

    def copy(local: Path) -> Path:
        if not location.reachable(location.join(url, STATE), "checkpoint"):
            raise CheckpointError(f"checkpoint {url}: no {STATE} found (expected a wxray checkpoint directory)")
        for name in (STATE, META):
            if location.exists(location.join(url, name)):
                location.get(location.join(url, name), local / name)
        return local

    return local_copy(url, copy)


def local_copy(source: str, fill: Callable[[Path], Path], prefix: str = "wxray-checkpoint-") -> Path:
    """The local copy of `source` (a URL, an MLflow model URI), made once per process by `fill(folder)` in a
    temporary folder removed when the process ends; `fill` returns the copy's folder within it."""
    if source not in _fetched:
        local = Path(tempfile.mkdtemp(prefix=prefix))
        atexit.register(shutil.rmtree, local, True)
        _fetched[source] = fill(local)
    return _fetched[source]


def origin(path: str | Path) -> str:
    """Where a checkpoint came from: the URL or model URI of a fetched copy (or of the copy it lies in), else
    the path itself."""
    p = Path(path)
    return next((src for src, local in _fetched.items() if p == local or local in p.parents), str(path))


def load_model_weights(model: torch.nn.Module, state: dict[str, Any], where: str) -> None:
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as e:
        first = str(e).splitlines()[1].strip() if len(str(e).splitlines()) > 1 else str(e)
        raise CheckpointError(f"checkpoint {where}: weights do not fit this model ({first})") from None


def part(state: dict[str, Any], prefix: str) -> dict[str, Any]:
    """The weights of one part of a composite model from its checkpoint state: the `model` entries under
    `prefix` (e.g. "encoder." of a chain), with the prefix cut."""
    return {k[len(prefix):]: v for k, v in state["model"].items() if k.startswith(prefix)}
