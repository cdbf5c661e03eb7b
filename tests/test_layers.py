"""The package's floors: models, data and verify never import the Ray layer (wxray.platform, wxray.tune);
models import nothing of data, verify or I/O libraries either."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "wxray"
FORBIDDEN = {
    "models": ("wxray.platform", "wxray.tune", "wxray.data", "wxray.verify", "wxray.job", "wxray.tracking",
               "ray", "mlflow", "xarray", "zarr"),
    "data": ("wxray.platform", "wxray.tune", "ray"),
    "verify": ("wxray.platform", "wxray.tune", "ray"),
}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_lower_layers_do_not_import_upper_ones(layer):
    bad = []
    for f in sorted((PKG / layer).rglob("*.py")):
        for mod in imported_modules(f):
            if any(mod == p or mod.startswith(p + ".") for p in FORBIDDEN[layer]):
                bad.append(f"{f.relative_to(PKG.parent)} imports {mod}")
    assert not bad, "\n".join(bad)
