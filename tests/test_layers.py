"""The package's floors (docs/ARCHITECTURE.md): models, data, verify and forecast never import the Ray layer
(wxray.platform, wxray.tune, ray); models import nothing of data, verify or I/O libraries either (of wxray only
its config vocabulary and errors), verify nothing of models, data nothing of the job plumbing above it (job.py,
tracking, provenance) or of the rooms above; the platform's rooms import one way (cluster <- train, cluster <-
ensemble: the ensemble jobs take what they run from the forecast room, never from training); and no module hides
an import of wxray in a function (a circle would hide there)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "wxray"
FORBIDDEN = {
    "models": ("wxray.platform", "wxray.tune", "wxray.data", "wxray.verify", "wxray.job", "wxray.tracking",
               "ray", "mlflow", "xarray", "zarr"),
    "data": ("wxray.platform", "wxray.tune", "ray", "wxray.job", "wxray.tracking", "wxray.provenance", "wxray.cli",
             "wxray.verify", "wxray.forecast", "wxray.prepare"),
    "verify": ("wxray.platform", "wxray.tune", "wxray.models", "ray", "torch", "wxray.forecast", "wxray.prepare"),
    "forecast": ("wxray.platform", "wxray.tune", "ray", "wxray.prepare", "wxray.cli"),
    "prepare": ("wxray.platform", "wxray.tune", "ray", "wxray.forecast", "wxray.cli"),
    "platform/cluster": ("wxray.platform.train", "wxray.platform.ensemble", "wxray.platform.ingest", "wxray.tune"),
    "platform/train": ("wxray.platform.ensemble", "wxray.platform.ingest", "wxray.tune"),
    "platform/ensemble": ("wxray.platform.train", "wxray.platform.ingest", "wxray.tune"),
    "platform/ingest": ("wxray.platform.train", "wxray.platform.ensemble", "wxray.tune"),
}
MODELS_MAY_IMPORT = ("wxray.models", "wxray.config", "wxray.errors")


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


def test_models_import_of_wxray_only_their_own_config_vocabulary_and_errors():
    bad = [f"{f.relative_to(PKG.parent)} imports {mod}" for f in sorted((PKG / "models").rglob("*.py"))
           for mod in imported_modules(f) if mod.startswith("wxray") and not mod.startswith(MODELS_MAY_IMPORT)]
    assert not bad, "\n".join(bad)


def test_no_import_of_wxray_inside_a_function():
    """Imports of wxray modules sit at the top of the module: one hidden in a function is how an import circle
    hides (heavy third-party libraries, e.g. ray or matplotlib, may still load where they are used)."""
    bad = []
    for f in sorted(PKG.rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for sub in ast.walk(node):
                    if isinstance(sub, ast.ImportFrom) and (sub.module or "").startswith("wxray") or \
                            isinstance(sub, ast.Import) and any(a.name.startswith("wxray") for a in sub.names):
                        bad.append(f"{f.relative_to(PKG.parent)}:{sub.lineno} in {node.name}()")
    assert not bad, "\n".join(bad)
