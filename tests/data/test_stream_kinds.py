"""Stream kinds by registry: a kind defined here (one class + one `KINDS` entry) flows through obs.yaml, the window
reader and the encoder untouched; every kind's windows hold what its embedding reads; nothing outside the kind
modules dispatches on a kind's name; the obs registry stays free of torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from tests.data.obs_helpers import STEP, T0, point_stream, write_obs_dir
from wxray.data.e2e_windows import station_info
from wxray.data.obs import ObsWindowReader, make_obs_spec, open_registry
from wxray.data.obs.kinds import KINDS, StreamKind, kind_of
from wxray.data.obs.registry import REGISTRY, StreamInfo, write_registry
from wxray.data.obs.windows import count_reports
from wxray.errors import ConfigError, DataError
from wxray.forecast.stages import stream_inputs
from wxray.models import EMBEDDINGS, ObsEncoder

PKG = Path(__file__).resolve().parents[2] / "wxray"
H = np.timedelta64(3600, "s")


class TableKind(StreamKind):
    """Reports in one CSV file per stream (time, latitude, longitude, <variables>): a kind the package lacks,
    embedded points -> grid. Windows: coords (b, N, 2), values and mask (b, N, C), N = W * max_per_step."""

    name = "table"
    embedding = "points_to_grid"
    required = ("coords", "values", "mask")
    min_per_step = 1

    def window_reader(self, info, spec):
        df = pd.read_csv(self.data_path(info, spec.obs_dir), parse_dates=["time"]).sort_values("time")
        t = df["time"].to_numpy("datetime64[ns]")
        mean, std = info.channel_stats()
        n = spec.window_steps * info.max_per_step

        def read(lo, hi):
            out = {k: np.zeros((len(lo), n, c), np.float32) for k, c in
                   (("coords", 2), ("values", info.n_channels), ("mask", info.n_channels))}
            for i in range(len(lo)):
                rows = df[(t > lo[i]) & (t <= hi[i])]
                x = rows[info.variables].to_numpy(np.float32)
                out["coords"][i, :len(rows)] = rows[["latitude", "longitude"]].to_numpy(np.float32)
                out["values"][i, :len(rows)] = np.nan_to_num((x - mean) / std)
                out["mask"][i, :len(rows)] = ~np.isnan(x)
            return {f"obs.{info.name}.{k}": v for k, v in out.items()}

        return read

    def count_reports(self, info, obs_dir, lo, hi):
        t = pd.read_csv(self.data_path(info, obs_dir), parse_dates=["time"])["time"].to_numpy("datetime64[ns]")
        return int(((t > lo) & (t <= hi)).sum())


@pytest.fixture
def table_obs(tmp_path):
    """An obs dir with a point stream and a `table` stream (buoys: one report missing, one outside the window)."""
    rows = [{"time": str(T0 - 2 * H), "station": "A", "latitude": 0.0, "longitude": 0.0, "t": 280.0}]
    reg = write_obs_dir(tmp_path / "obs", [point_stream("stations", rows, ["t"])])
    pd.DataFrame({"time": [T0 - 7 * H, T0 - 2 * H, T0 - H], "latitude": [50.0, -10.0, 10.0],
                  "longitude": [5.0, 200.0, 20.0], "sst": [279.0, np.nan, 282.0]}).to_csv(tmp_path / "obs" / "b.csv",
                                                                                 index=False)
    reg.streams["buoys"] = StreamInfo("buoys", TableKind.name, "b.csv", ["sst"], [], {"sst": 280.0}, {"sst": 2.0},
                                      {"sst": None}, max_per_step=2)
    write_registry(reg)
    return tmp_path / "obs"


def test_a_new_kind_is_one_class_and_one_registry_line(table_obs, monkeypatch):
    with pytest.raises(DataError, match=r"streams\.buoys\.kind' must be one of point, gridded, got 'table'"):
        open_registry(table_obs)
    monkeypatch.setitem(KINDS, TableKind.name, TableKind())  # the one registry line

    buoys = open_registry(table_obs).streams["buoys"]
    assert isinstance(kind_of(buoys), TableKind) and buoys.channels == ["sst"]
    (table_obs / "b.csv").rename(table_obs / "gone.csv")  # the kind's data path is checked when opening
    with pytest.raises(DataError, match=r"stream 'buoys' has no data at .*b\.csv"):
        open_registry(table_obs)
    (table_obs / "gone.csv").rename(table_obs / "b.csv")
    text = (table_obs / REGISTRY).read_text()
    (table_obs / REGISTRY).write_text(text.replace("kind: table", "kind: radar"))
    with pytest.raises(DataError, match="must be one of point, gridded, table, got 'radar'"):  # from the registry
        open_registry(table_obs)
    (table_obs / REGISTRY).write_text(text)

    spec = make_obs_spec(table_obs, STEP)
    batch = ObsWindowReader(spec)(np.array([T0]))
    assert sorted(k for k in batch if k.startswith("obs.buoys.")) == ["obs.buoys.coords", "obs.buoys.mask",
                                                                       "obs.buoys.values"]
    np.testing.assert_array_equal(batch["obs.buoys.coords"][0], [[-10.0, 200.0], [10.0, 20.0]])
    np.testing.assert_array_equal(batch["obs.buoys.values"][0, :, 0], [0.0, 1.0])  # (282 - 280) / 2
    np.testing.assert_array_equal(batch["obs.buoys.mask"][0, :, 0], [0.0, 1.0])
    assert count_reports(spec, spec.streams[1], T0 - 8 * H, T0) == 3
    with pytest.raises(ConfigError, match="data.station_stream=buoys is a table stream; stations need a point"):
        station_info(spec, "buoys", "data.station_stream")

    inputs = stream_inputs(SimpleNamespace(obs=spec))
    assert [(s.name, s.embedding, s.n_channels) for s in inputs] == [("stations", "points_to_grid", 1),
                                                                    ("buoys", "points_to_grid", 1)]
    torch.manual_seed(0)
    enc = ObsEncoder(inputs, torch.linspace(-80, 80, 8), torch.arange(16) * 22.5, n_static=0, n_out=2, hidden=4,
                     embed_dim=8, depth=1, num_heads=2)
    obs = {k: torch.as_tensor(v) for k, v in batch.items()}
    e = enc.embed(obs)[:, enc.stream_channels("buoys")]
    direct = enc.setconvs[1].points_to_grid(obs["obs.buoys.coords"], obs["obs.buoys.values"], obs["obs.buoys.mask"],
                                            enc.latitude, enc.longitude)
    assert torch.equal(e, direct) and e[:, 0].max() > 0  # the buoy at (10, 20) is seen


def test_every_kind_feeds_an_embedding_with_the_keys_it_reads(small_obs):
    for name, kind in KINDS.items():
        emb = EMBEDDINGS[kind.embedding]
        assert kind.name == name
        assert set(emb.required) <= set(kind.required) <= set(emb.required + emb.optional), name
        assert set(kind.optional) <= set(emb.required + emb.optional), name
    spec = make_obs_spec(small_obs.obs_dir, STEP)
    batch = ObsWindowReader(spec)(np.array(["2000-01-01T12"], dtype="datetime64[ns]"))
    assert {kind_of(s).name for s in spec.streams} == set(KINDS)  # the sample has every kind
    for s in spec.streams:
        held = {k for k in batch if k.startswith(f"obs.{s.name}.")}
        assert held == {f"obs.{s.name}.{k}" for k in kind_of(s).keys(s, spec.obs_dir)}, s.name


# --- no string dispatch on a stream's kind outside the kind modules and the registry --------------------------

ALLOWED = ("data/obs/kinds/", "data/obs/registry.py")


def _kind_like(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "kind" or isinstance(node, ast.Name) and node.id == "kind"


def _names_a_kind(node: ast.AST, names: set[str]) -> bool:
    """A kind's name as a literal, a constant named after it (POINT), or a collection of those."""
    if isinstance(node, ast.Constant):
        return node.value in names
    if isinstance(node, (ast.Name, ast.Attribute)):
        return (node.id if isinstance(node, ast.Name) else node.attr) in {n.upper() for n in names}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_a_kind(e, names) for e in node.elts)
    return False


def kind_dispatch(source: str, names: set[str]) -> list[int]:
    """Lines that compare a kind to a kind's name, match on one, or key a dict literal by kind names."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(map(_kind_like, operands)) and any(_names_a_kind(o, names) for o in operands):
                lines.append(node.lineno)
        elif isinstance(node, ast.Match) and _kind_like(node.subject):
            lines.append(node.lineno)
        elif isinstance(node, ast.Dict) and any(k is not None and _names_a_kind(k, names) for k in node.keys):
            lines.append(node.lineno)
    return lines


@pytest.mark.parametrize("source, flagged", [
    ('if s.kind == "point":\n    pass', True),
    ("x = info.kind != GRIDDED", True),
    ('if kind in ("point", "gridded"):\n    pass', True),
    ('grid = {} if s.kind == "point" else 1', True),
    ('match s.kind:\n    case "gridded":\n        pass', True),
    ('KEYS = {"point": 1, "gridded": 2}', True),
    ("k = KINDS[s.kind]", False),
    ('if a.kind == "grid":\n    pass', False),  # a tune axis' kind, not a stream's
    ('d = {"kind": s.kind}', False),
    ('f(dim="point")', False),
])
def test_the_dispatch_check_sees_string_dispatch(source, flagged):
    assert bool(kind_dispatch(source, set(KINDS))) is flagged


def test_no_string_dispatch_on_stream_kinds_outside_the_kind_modules():
    bad = []
    for f in sorted(PKG.rglob("*.py")):
        rel = f.relative_to(PKG).as_posix()
        if not rel.startswith(ALLOWED):
            bad += [f"wxray/{rel}:{line}" for line in kind_dispatch(f.read_text(), set(KINDS))]
    assert not bad, "look the kind up in wxray.data.obs.kinds.KINDS instead:\n" + "\n".join(bad)


def test_the_obs_registry_windows_and_kinds_import_no_torch():
    code = ("import sys, wxray.data.obs.registry, wxray.data.obs.windows, wxray.data.obs.kinds; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
