"""Dependencies point one way: a module imports only from its own layer or below (lazily or
not), no two modules import each other, and ``import verispec`` stays light.

Layers, bottom up: helpers (checks, sampling, telemetry) → models → drafters and verify →
engine → methods → theory → api → bench → cli and server.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "verispec"

LAYERS = {
    "verispec.checks": 0, "verispec.sampling": 0, "verispec.telemetry": 0,
    "verispec.models": 1,
    "verispec.drafters": 2, "verispec.verify": 2,
    "verispec.engine": 3,
    "verispec.methods": 4,
    "verispec.theory": 5, "verispec.plan": 5,
    "verispec.api": 6,
    "verispec.bench": 7,
    "verispec.cli": 8, "verispec.server": 8,
}


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _layer(module: str) -> int | None:
    for prefix in sorted(LAYERS, key=len, reverse=True):
        if module == prefix or module.startswith(prefix + "."):
            return LAYERS[prefix]
    return None


def _imports(root: Path = SRC) -> dict[str, set[str]]:
    """Every verispec module imported by each module under ``root`` (the ``verispec`` package
    directory), at any depth of its code."""
    graph: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        name = _module_name(path, root)
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.startswith("verispec"))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative import
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]
                                    + ([base] if base else []))
                if base.startswith("verispec"):
                    found.add(base)
        graph[name] = found
    return graph


def test_every_module_has_a_layer() -> None:
    missing = [m for m in _imports() if m != "verispec" and _layer(m) is None]
    assert not missing, f"modules outside every layer: {missing}"


def _upward_imports(root: Path = SRC) -> list[str]:
    """Each import under ``root`` that points from a module to a higher layer, sorted."""
    upward = []
    for module, targets in _imports(root).items():
        own = _layer(module)
        if own is None:  # the package itself exports the API
            continue
        for target in targets:
            layer = _layer(target)
            if layer is not None and layer > own:
                upward.append(f"{module} (layer {own}) imports {target} (layer {layer})")
    return sorted(upward)


def test_no_module_imports_a_higher_layer() -> None:
    upward = _upward_imports()
    assert not upward, "\n".join(upward)


def test_no_two_modules_import_each_other() -> None:
    graph = _imports()
    pairs = sorted({tuple(sorted((a, b))) for a, targets in graph.items() for b in targets
                    if b != a and a in graph.get(b, set())})
    assert not pairs, f"mutual imports: {pairs}"


def test_the_layer_walk_catches_an_upward_import(tmp_path: Path) -> None:
    """Negative control: the walk the package test runs reports an engine module that imports
    the api (lazily, inside a function, through a relative import) and nothing else."""
    root = tmp_path / "verispec"
    (root / "engine").mkdir(parents=True)
    (root / "__init__.py").write_text("from verispec.api import generate\n", encoding="utf-8")
    (root / "api.py").write_text("from verispec.engine.loop import run\n", encoding="utf-8")
    (root / "engine" / "__init__.py").write_text("", encoding="utf-8")
    (root / "engine" / "loop.py").write_text(
        "from verispec.checks import check\n"
        "def run():\n"
        "    from ..api import generate\n"
        "    return generate\n", encoding="utf-8")
    (root / "checks.py").write_text("def check():\n    pass\n", encoding="utf-8")
    assert _upward_imports(root) == [
        "verispec.engine.loop (layer 3) imports verispec.api (layer 6)"]


@pytest.mark.parametrize("heavy", ["verispec.methods.pearl.coordinator", "verispec.theory",
                                   "verispec.models.toy", "transformers", "verispec.bench"])
def test_import_verispec_is_light(heavy: str) -> None:
    code = f"import sys, verispec; print({heavy!r} in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", f"import verispec loads {heavy}"
