"""The layers point one way: no module of gpuguard imports a layer above its own (ast only, nothing imported).

errors/escape (0) <- events (1) <- sources (2) <- correlate (3) <- detect (4)
<- {respond, outputs} (5) <- agent (6) <- proving (7) <- commands, cli, __main__ (8);
respond and outputs never import each other.  Lazy imports (inside functions) and
``if TYPE_CHECKING:`` imports count too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "gpuguard"
LAYERS = {
    "errors": 0,
    "escape": 0,
    "events": 1,
    "sources": 2,
    "correlate": 3,
    "detect": 4,
    "respond": 5,
    "outputs": 5,
    "agent": 6,
    "proving": 7,  # selftest, simulator, enforce scope: prove the agent, outside its flow
    "commands": 8,
    "cli": 8,
    "__main__": 8,
    "__init__": 0,  # gpuguard/__init__.py: the docstring and __version__ only, importable by all
}
SIBLINGS_APART = {"respond", "outputs"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def top_part(module: str) -> str:
    """The first component under gpuguard (``gpuguard`` itself is its own __init__)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` of every gpuguard import in ``path``, relative ones resolved."""
    tree = ast.parse(path.read_text(), str(path))
    package = (
        module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    )
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            if (
                base == "gpuguard"
            ):  # from gpuguard import events: a submodule, or a name of gpuguard/__init__
                found += [
                    (
                        node.lineno,
                        f"gpuguard.{alias.name}" if _is_submodule(alias.name) else "gpuguard",
                    )
                    for alias in node.names
                ]
            else:
                found.append((node.lineno, base))
    return [
        (line, name) for line, name in found if name == "gpuguard" or name.startswith("gpuguard.")
    ]


def _is_submodule(name: str) -> bool:
    return (PACKAGE / name).is_dir() or (PACKAGE / f"{name}.py").is_file()


def layer_of(module: str) -> int:
    part = top_part(module)
    assert part in LAYERS, f"{module}: no layer assigned to gpuguard.{part}; add it to LAYERS"
    return LAYERS[part]


MODULES = sorted(PACKAGE.rglob("*.py"))


def violations(path: Path) -> list[str]:
    own = module_name(path)
    own_part = top_part(own) if path != PACKAGE / "__init__.py" else "__init__"
    if path.parent == PACKAGE and path.stem in LAYERS:
        own_part = path.stem
    own_layer = LAYERS[own_part]
    out = []
    for line, target in imported_modules(path):
        part = top_part(target)
        if layer_of(target) > own_layer:
            out.append(
                f"{path.relative_to(PACKAGE.parent)}:{line}: {own_part} (layer {own_layer}) imports "
                f"{target} ({part}, layer {layer_of(target)})"
            )
        elif own_part in SIBLINGS_APART and part in SIBLINGS_APART and part != own_part:
            out.append(
                f"{path.relative_to(PACKAGE.parent)}:{line}: {own_part} imports {target}: "
                "respond and outputs never import each other (shared data lives in events)"
            )
    return out


def test_every_module_has_a_layer():
    for path in MODULES:
        part = path.stem if path.parent == PACKAGE else path.relative_to(PACKAGE).parts[0]
        assert part in LAYERS, f"{path}: add gpuguard.{part} to LAYERS"


@pytest.mark.parametrize("path", MODULES, ids=[str(p.relative_to(PACKAGE)) for p in MODULES])
def test_no_module_imports_a_higher_layer(path):
    assert violations(path) == []


def test_the_check_catches_upward_and_sideways_imports(tmp_path, monkeypatch):
    """The checker itself: an upward import, a lazy one, a TYPE_CHECKING one and a sideways one are caught."""
    fake = tmp_path / "gpuguard"
    for sub in ("correlate", "outputs", "events"):
        (fake / sub).mkdir(parents=True)
        (fake / sub / "__init__.py").write_text('"""x"""\n')
    (fake / "__init__.py").write_text("")
    (fake / "correlate" / "bad.py").write_text(
        "from typing import TYPE_CHECKING\nfrom gpuguard.events import model\n"
        "if TYPE_CHECKING:\n    from gpuguard.detect.score import Verdict\n"
        "def f():\n    from ..detect import rules\n    import gpuguard.commands.scan\n"
    )
    (fake / "outputs" / "side.py").write_text(
        "from gpuguard.respond import actions\nfrom gpuguard import escape\n"
    )
    monkeypatch.setattr(__import__(__name__), "PACKAGE", fake)
    assert [v.split(": ", 1)[1] for v in violations(fake / "correlate" / "bad.py")] == [
        "correlate (layer 3) imports gpuguard.detect.score (detect, layer 4)",
        "correlate (layer 3) imports gpuguard.detect (detect, layer 4)",
        "correlate (layer 3) imports gpuguard.commands.scan (commands, layer 8)",
    ]
    assert len(violations(fake / "outputs" / "side.py")) == 1
    assert violations(fake / "events" / "__init__.py") == []


PACKAGES = sorted(PACKAGE.rglob("__init__.py"))


@pytest.mark.parametrize("init", PACKAGES, ids=[str(p.relative_to(PACKAGE)) for p in PACKAGES])
def test_each_package_says_what_it_owns_and_may_import(init):
    doc = ast.get_docstring(ast.parse(init.read_text()))
    assert doc and len(doc.splitlines()[0]) > 20, (
        f"{init}: a docstring saying what the package owns"
    )
    if init.parent != PACKAGE:
        assert "may import" in doc.lower(), f"{init}: say what the package may import"
