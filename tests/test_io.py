from __future__ import annotations

import pytest

from wxray.io import atomic_path, write_json


def test_atomic_path_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "store.zarr"
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.mkdir()
            (tmp / "part").write_text("half")
            raise RuntimeError("boom")
    assert not target.exists()
    assert list(tmp_path.iterdir()) == []


def test_atomic_path_replaces_existing_output_whole(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    (target / "old").write_text("old")
    with atomic_path(target) as tmp:
        tmp.mkdir()
        (tmp / "new").write_text("new")
    assert sorted(p.name for p in target.iterdir()) == ["new"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_write_json(tmp_path):
    p = write_json(tmp_path / "s.json", {"a": 1})
    assert p.read_text().strip().startswith("{")
