"""The layers point one way: no module of gpuguard imports a layer above its own (ast only, nothing imported).

errors/escape (0) <- config (0.5) <- events (1) <- sources (2) <- correlate (3) <- detect (4)
<- {respond, outputs} (5) <- agent (6) <- proving (7) <- commands, cli, __main__ (8);
respond and outputs never import each other.  Lazy imports (inside functions) and
``if TYPE_CHECKING:`` imports count too.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "gpuguard"
LAYERS = {
    "errors": 0,
    "escape": 0,
    "config": 0.5,  # YAML with positions, the file checks, the schema: below everything else
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
            # from gpuguard import events, from gpuguard.respond import bpf_pins: a submodule;
            # any other name is one of the package's own (its __init__)
            found += [(node.lineno, _submodule_or(base, alias.name)) for alias in node.names]
    return [
        (line, name) for line, name in found if name == "gpuguard" or name.startswith("gpuguard.")
    ]


def _submodule_or(base: str, name: str) -> str:
    """``base.name`` when that is a module of the tree, else ``base``."""
    sub = f"{base}.{name}"
    return sub if base.startswith("gpuguard") and _module_path(sub) is not None else base


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
        "if TYPE_CHECKING:\n    from gpuguard.detect.scoring.score import Verdict\n"
        "def f():\n    from ..detect import rules\n    import gpuguard.commands.scan\n"
    )
    (fake / "outputs" / "side.py").write_text(
        "from gpuguard.respond import actions\nfrom gpuguard import escape\n"
    )
    monkeypatch.setattr(__import__(__name__), "PACKAGE", fake)
    assert [v.split(": ", 1)[1] for v in violations(fake / "correlate" / "bad.py")] == [
        "correlate (layer 3) imports gpuguard.detect.scoring.score (detect, layer 4)",
        "correlate (layer 3) imports gpuguard.detect (detect, layer 4)",
        "correlate (layer 3) imports gpuguard.commands.scan (commands, layer 8)",
    ]
    assert len(violations(fake / "outputs" / "side.py")) == 1
    assert violations(fake / "events" / "__init__.py") == []


# -- no import circle inside a package -------------------------------------------------------------

# Every package's modules import each other one way only: every import counts (lazy ones and
# ``if TYPE_CHECKING:`` ones too), as written; the parent packages Python runs first do not.
NO_CIRCLES = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())
# And the folders inside a package, each taken as one room (``sources/ebpf``, ``detect/ruleset``):
# a folder that imports another never imported back, however deep it sits.
FOLDERS = sorted(
    str(p.parent.relative_to(PACKAGE))
    for p in PACKAGE.rglob("__init__.py")
    if p.parent != PACKAGE
    and any(c.is_dir() and (c / "__init__.py").is_file() for c in p.parent.iterdir())
)


def import_graph(package: str) -> dict[str, set[str]]:
    """``{module: the modules of gpuguard.<package> it imports}`` (``package``: ``agent/stages``)."""
    prefix = "gpuguard." + package.replace("/", ".")
    graph = {}
    for path in sorted((PACKAGE / package).rglob("*.py")):
        own = module_name(path)
        graph[own] = {
            target
            for _, target in imported_modules(path)
            if (target == prefix or target.startswith(prefix + ".")) and target != own
        }
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each set of modules that import each other round in a circle (Tarjan's strongly
    connected components of two or more), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(graph.get(module, ())):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(found)


def folder_graph(package: str) -> dict[str, set[str]]:
    """``{room: the rooms it imports}`` inside ``gpuguard/<package>``, each sub-folder one room
    and each module directly in the package its own."""
    depth = package.count("/") + 3  # gpuguard, the package's parts, the room

    def room(module: str) -> str:
        return ".".join(module.split(".")[:depth])

    graph: dict[str, set[str]] = {}
    for module, targets in import_graph(package).items():
        graph.setdefault(room(module), set()).update(
            room(t) for t in targets if room(t) != room(module)
        )
    return graph


@pytest.mark.parametrize("package", NO_CIRCLES)
def test_no_import_circle_in_the_package(package):
    assert circles(import_graph(package)) == []


@pytest.mark.parametrize("package", FOLDERS)
def test_no_import_circle_between_the_folders_of_a_package(package):
    assert circles(folder_graph(package)) == []


def test_the_circle_check_catches_a_type_checking_and_a_submodule_circle(tmp_path, monkeypatch):
    fake = tmp_path / "gpuguard"
    (fake / "respond" / "actions").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "respond" / "__init__.py").write_text('"""x"""\n')
    (fake / "respond" / "actions" / "__init__.py").write_text(
        "from gpuguard.respond.actions import kill\n"
    )
    (fake / "respond" / "actions" / "kill.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from gpuguard.respond.responder import Responder\n"
    )
    (fake / "respond" / "responder.py").write_text("from gpuguard.respond import actions, blocks\n")
    (fake / "respond" / "blocks.py").write_text("from gpuguard.respond import lift\n")
    (fake / "respond" / "lift.py").write_text("def f():\n    from . import blocks\n")
    (fake / "respond" / "alone.py").write_text("from gpuguard.respond import blocks\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", fake)
    assert circles(import_graph("respond")) == [
        ["gpuguard.respond.actions", "gpuguard.respond.actions.kill", "gpuguard.respond.responder"],
        ["gpuguard.respond.blocks", "gpuguard.respond.lift"],
    ]


def test_the_folder_check_catches_a_loop_through_three_folders(tmp_path, monkeypatch):
    """No module circle, yet ebpf -> gpu -> proc -> ebpf: the folders go round."""
    fake = tmp_path / "gpuguard"
    for sub in ("ebpf", "gpu", "proc"):
        (fake / "sources" / sub).mkdir(parents=True)
        (fake / "sources" / sub / "__init__.py").write_text('"""x"""\n')
    (fake / "__init__.py").write_text("")
    (fake / "sources" / "__init__.py").write_text('"""x"""\n')
    (fake / "sources" / "ebpf" / "sensor.py").write_text("from gpuguard.sources.gpu import nvml\n")
    (fake / "sources" / "gpu" / "nvml.py").write_text("from gpuguard.sources.proc import fd\n")
    (fake / "sources" / "proc" / "fd.py").write_text("from gpuguard.sources.ebpf import abi\n")
    (fake / "sources" / "ebpf" / "abi.py").write_text("X = 1\n")
    (fake / "sources" / "alone.py").write_text("from gpuguard.sources.proc import fd\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", fake)
    assert circles(import_graph("sources")) == []
    assert circles(folder_graph("sources")) == [
        ["gpuguard.sources.ebpf", "gpuguard.sources.gpu", "gpuguard.sources.proc"]
    ]


PACKAGES = sorted(PACKAGE.rglob("__init__.py"))


@pytest.mark.parametrize("init", PACKAGES, ids=[str(p.relative_to(PACKAGE)) for p in PACKAGES])
def test_each_package_says_what_it_owns_and_may_import(init):
    doc = ast.get_docstring(ast.parse(init.read_text()))
    assert doc and len(doc.splitlines()[0]) > 20, (
        f"{init}: a docstring saying what the package owns"
    )
    if init.parent != PACKAGE:
        assert "may import" in doc.lower(), f"{init}: say what the package may import"


# -- no registration as a side effect of import ---------------------------------------------------

MUTATORS = {"append", "extend", "add", "update", "setdefault", "insert", "__setitem__"}


def _module_globals(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def _mutated_names(node: ast.AST) -> set[str]:
    """Names that ``node`` changes in place: ``X[k] = v``, ``X.update(...)``, ``global X``
    (``mod.X`` where the table is reached through its module)."""
    found = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Subscript) and isinstance(sub.ctx, ast.Store):
            base = sub.value
        elif isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute):
            base = sub.func.value if sub.func.attr in MUTATORS else None
        elif isinstance(sub, ast.Global):
            found |= set(sub.names)
            continue
        else:
            continue
        if isinstance(base, ast.Name):
            found.add(base.id)
        elif isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name):
            found.add(f"{base.value.id}.{base.attr}")  # module.TABLE[k] = v, module.TABLE.update()
    return found


def _import_bindings(tree: ast.Module, path: Path) -> dict[str, tuple[str, str | None]]:
    """``{local name: (gpuguard module, attribute or None)}`` for the module's gpuguard imports."""
    package = (
        module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    )
    bound = {}
    for node in tree.body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and alias.name.startswith("gpuguard."):
                    bound[alias.asname] = (alias.name, None)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            if base.startswith("gpuguard"):
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    is_module = (PACKAGE.parent / sub.replace(".", "/")).is_dir() or (
                        PACKAGE.parent / (sub.replace(".", "/") + ".py")
                    ).is_file()
                    bound[alias.asname or alias.name] = (
                        (sub, None) if is_module else (base, alias.name)
                    )
    return bound


def _module_path(module: str) -> Path | None:
    base = PACKAGE.parent / module.replace(".", "/")
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


@functools.cache
def _registering_functions(module: str) -> frozenset[str]:
    """Top-level functions of ``module`` that change one of its module-level names when called."""
    path = _module_path(module)
    if path is None:
        return frozenset()
    tree = ast.parse(path.read_text(), str(path))
    module_globals = _module_globals(tree)
    return frozenset(
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and _mutated_names(node) & module_globals
    )


def _import_time_nodes(tree: ast.Module):
    """What runs on import: top-level statements and decorators (not function bodies).

    Yields ``(node, called)``: ``called`` for a decorator, which is called even when bare.
    """
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            yield from ((d, True) for d in node.decorator_list)
            if isinstance(node, ast.ClassDef):
                todo += node.body
        elif isinstance(node, ast.If | ast.Try | ast.With | ast.For | ast.While):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    todo.append(child)
                else:
                    yield child, False
        else:
            yield node, False


def _callee(func: ast.expr, own: str, imported: dict) -> tuple[str, str] | None:
    """``(module, function)`` that ``func`` names: local, imported by name or through its module."""
    if isinstance(func, ast.Name):
        module, name = imported.get(func.id, (own, func.id))
        return (module, name) if name else None
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        module, name = imported.get(func.value.id, (None, None))
        return (module, func.attr) if module and name is None else None
    return None


def import_time_registrations(path: Path) -> list[str]:
    """Where importing ``path`` changes a registry: a module-level change of a name another
    module owns, or a module-level call (a decorator included) of a function that changes its
    module's globals.  Registries are explicit lists; importing a module registers nothing."""
    tree = ast.parse(path.read_text(), str(path))
    own = module_name(path)
    imported = _import_bindings(tree, path)
    where = path.relative_to(PACKAGE.parent)
    out = []
    for node, called in _import_time_nodes(tree):
        for name in sorted(_mutated_names(node)):
            head = name.split(".")[0]
            if head in imported and (imported[head][1] is not None or "." in name):
                out.append(
                    f"{where}:{node.lineno}: changes {name} of {imported[head][0]} on import"
                )
        calls = [n.func for n in ast.walk(node) if isinstance(n, ast.Call)]
        for func in calls + ([node] if called else []):
            target = _callee(func, own, imported)
            if target and target[1] in _registering_functions(target[0]):
                out.append(
                    f"{where}:{func.lineno}: calls {'.'.join(target)} on import, which registers "
                    "into its module: list the entry in the registry's explicit list instead"
                )
    return sorted(set(out))


@pytest.mark.parametrize("path", MODULES, ids=[str(p.relative_to(PACKAGE)) for p in MODULES])
def test_no_module_registers_anything_when_imported(path):
    assert import_time_registrations(path) == []


def test_the_check_catches_registration_at_import(tmp_path, monkeypatch):
    """The checker itself: a registering decorator (here and from another module), a module-level
    change of another module's table, and a registering call are caught; a plain table is not."""
    fake = tmp_path / "gpuguard"
    (fake / "detect").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "detect" / "__init__.py").write_text('"""x"""\n')
    (fake / "detect" / "table.py").write_text(
        "TABLE = {}\n"
        "def signal(name):\n    def register(fn):\n        TABLE[name] = fn\n        return fn\n"
        "    return register\n"
        "def add(row):\n    TABLE.setdefault(row, row)\n"
        "@signal('a')\ndef a(): pass\n"
    )
    (fake / "detect" / "more.py").write_text(
        "from gpuguard.detect import table\nfrom gpuguard.detect.table import TABLE, signal\n"
        "@signal('b')\ndef b(): pass\n"
        "TABLE.update({'c': None})\n"
        "table.add('d')\n"
        "if True:\n    TABLE['e'] = None\n"
        "table.TABLE['f'] = None\n"
    )
    (fake / "detect" / "plain.py").write_text(
        "from gpuguard.detect.table import add\n"
        "ROWS = {'a': 1}\nROWS['b'] = 2\n"
        "def later():\n    add('x')\n"
    )
    monkeypatch.setattr(__import__(__name__), "PACKAGE", fake)
    _registering_functions.cache_clear()
    try:
        found = import_time_registrations(fake / "detect" / "more.py")
        assert [" ".join(v.split()[:3]) for v in found] == [
            "gpuguard/detect/more.py:3: calls gpuguard.detect.table.signal",
            "gpuguard/detect/more.py:5: changes TABLE",
            "gpuguard/detect/more.py:6: calls gpuguard.detect.table.add",
            "gpuguard/detect/more.py:8: changes TABLE",
            "gpuguard/detect/more.py:9: changes table.TABLE",
        ]
        assert len(import_time_registrations(fake / "detect" / "table.py")) == 1
        assert import_time_registrations(fake / "detect" / "plain.py") == []
    finally:
        _registering_functions.cache_clear()


def _decorated_signals() -> set[tuple[str, str]]:
    """``(module, function)`` of every function defined as a rule signal (``@signal(...)``)."""
    found = set()
    for path in MODULES:
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and any(
                isinstance(d, ast.Call) and getattr(d.func, "id", None) == "signal"
                for d in node.decorator_list
            ):
                found.add((module_name(path), node.name))
    return found


def _listed_signals() -> list[tuple[str, str]]:
    """``(module, function)`` of each entry of ``signal_table.SIGNAL_FUNCTIONS``."""
    path = PACKAGE / "detect" / "signals" / "table.py"
    tree = ast.parse(path.read_text())
    bound = _import_bindings(tree, path)
    table = next(
        n.value
        for n in tree.body
        if isinstance(n, ast.AnnAssign) and getattr(n.target, "id", "") == "SIGNAL_FUNCTIONS"
    )
    return [(bound[e.value.id][0], e.attr) for e in table.elts]


def test_every_defined_signal_is_in_the_one_list():
    listed = _listed_signals()
    assert len(listed) == len(set(listed)), "a signal listed twice in detect/signals/table.py"
    missing = sorted(_decorated_signals() - set(listed))
    assert not missing, (
        f"defined but not listed in detect/signals/table.py SIGNAL_FUNCTIONS: {missing}"
    )
    assert set(listed) <= _decorated_signals()


MAX_DOCSTRING_LINES = 15


def summary_problem(path: Path) -> str | None:
    """What is wrong with a module docstring, or None: its first line says what the module is,
    alone on its line, in at most 100 characters, and the whole docstring is at most
    MAX_DOCSTRING_LINES lines (the reasoning goes in docs/, e.g. docs/internals.md)."""
    doc = ast.get_docstring(ast.parse(path.read_text()))
    if not doc:
        return "no module docstring"
    lines = doc.splitlines()
    if len(lines[0]) > 100:
        return f"first line is {len(lines[0])} characters (at most 100)"
    if len(lines) > 1 and lines[1].strip():
        return "the first sentence runs onto a second line (one summary line, then a blank line)"
    if len(lines) > MAX_DOCSTRING_LINES:
        return f"{len(lines)} lines (at most {MAX_DOCSTRING_LINES}: move the essay to docs/)"
    return None


@pytest.mark.parametrize("path", MODULES, ids=[str(p.relative_to(PACKAGE)) for p in MODULES])
def test_each_module_docstring_starts_with_one_short_line(path):
    assert summary_problem(path) is None, f"{path}: {summary_problem(path)}"


def test_the_docstring_check_catches_long_and_wrapped_first_lines(tmp_path):
    cases = {
        "ok.py": '"""A module.\n\nMore.\n"""\n',
        "long.py": '"""' + "x" * 101 + '\n"""\n',
        "wrapped.py": '"""A summary that\ngoes on.\n"""\n',
        "none.py": "import os\n",
        "essay.py": '"""A module.\n\n' + "More.\n" * 15 + '"""\n',
    }
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
    found = {name: summary_problem(tmp_path / name) for name in cases}
    assert found["ok.py"] is None
    assert "101 characters" in found["long.py"]
    assert "second line" in found["wrapped.py"]
    assert found["none.py"] == "no module docstring"
    assert "17 lines" in found["essay.py"]


# -- the agent's flow: stages in order, each owning its state ---------------------------------------

STAGES = PACKAGE / "agent" / "stages"
PIPELINE_MAX_LINES = 150
# What correlation owns on a process's state: only correlate (and its Correlator.apply_scoring)
# writes these; the engine returns them in a Scoring, stages read them.  What detect derives
# from a state it keeps in its own memo (detect.signals.memo), stamped with the generations.
CORRELATION_OWNED = {
    "verdict",
    "dirty",
    "parent_verdict",
    "facts_gen",
    "network_gen",
    "devices_gen",
}


def test_the_pipeline_only_builds_and_orders_the_stages():
    lines = (PACKAGE / "agent" / "pipeline.py").read_text().count("\n")
    assert lines <= PIPELINE_MAX_LINES, f"agent/pipeline.py has {lines} lines (at most 150)"


def stage_order(path: Path) -> int:
    """s4_score.py -> 4, s5_report/findings.py -> 5: the stage's place in the flow."""
    part = next(p for p in path.relative_to(STAGES).parts if re.match(r"s[0-9]_", p))
    return int(part[1 : part.index("_")])


def stage_imports_later_stage(path: Path) -> list[str]:
    """Imports of a later stage (a stage's folder may import its own helpers)."""
    found = []
    for line, module in imported_modules(path):
        if module.startswith("gpuguard.agent.stages.s"):
            if stage_order(STAGES / module.split(".")[3]) > stage_order(path):
                found.append(f"{path.name}:{line} imports {module} (a later stage)")
    return found


def writes_to_correlation_state(path: Path) -> list[str]:
    """``x.verdict = ...``, ``x.dirty = ...``, ``x.facts_gen += 1`` on anything but ``self``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        else:
            continue
        for target in targets:
            if isinstance(target, ast.Subscript):
                target = target.value
            if (
                isinstance(target, ast.Attribute)
                and target.attr in CORRELATION_OWNED
                and not (isinstance(target.value, ast.Name) and target.value.id == "self")
            ):
                found.append(f"{path.name}:{node.lineno} writes .{target.attr}")
    return found


STAGE_FILES = sorted([*STAGES.glob("s[0-9]_*.py"), *STAGES.glob("s[0-9]_*/*.py")])


@pytest.mark.parametrize("path", STAGE_FILES, ids=[str(p.relative_to(STAGES)) for p in STAGE_FILES])
def test_a_stage_imports_no_later_stage(path):
    assert stage_imports_later_stage(path) == []


@pytest.mark.parametrize(
    "path",
    [
        *sorted((PACKAGE / "detect").rglob("*.py")),
        *(p for p in STAGE_FILES if stage_order(p) != 3),
    ],
    ids=lambda p: str(p.relative_to(PACKAGE)),
)
def test_only_correlation_writes_its_verdicts_and_dirty_marks(path):
    found = writes_to_correlation_state(path)
    assert [
        w for w in found if (w.split(":", 1)[0], w.rsplit(".", 1)[1]) not in NOT_PROCESS_STATE
    ] == []


# Writes the name-based check takes for a process state's and that are not: a host finding's
# verdict, which detect.host gives it from the rule set's thresholds; an open finding's latest
# verdict (the report stage's own bookkeeping, agent/stages/s5_report/findings.py).
NOT_PROCESS_STATE = {("checks.py", "verdict"), ("findings.py", "verdict")}


def test_the_stage_checks_catch_a_backward_import_and_a_foreign_write(tmp_path, monkeypatch):
    stages = tmp_path / "agent" / "stages"
    stages.mkdir(parents=True)
    (stages / "s2_enrich.py").write_text("from gpuguard.agent.stages.s5_report import X\n")
    (stages / "s5_report.py").write_text(
        "def f(state, v):\n    state.verdict = v\n    state.facts_gen += 1\n    self.dirty = 1\n"
    )
    (stages / "s4_score").mkdir()
    (stages / "s4_score" / "__init__.py").write_text(
        "from gpuguard.agent.stages.s4_score.memo import M\n"
        "from gpuguard.agent.stages.s1_produce import P\n"
    )
    (stages / "s4_score" / "memo.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from gpuguard.agent.stages.s6_act.outcomes import record\n"
    )
    monkeypatch.setattr(__import__(__name__), "STAGES", stages)
    monkeypatch.setattr(__import__(__name__), "PACKAGE", tmp_path)
    assert stage_imports_later_stage(stages / "s2_enrich.py") == [
        "s2_enrich.py:1 imports gpuguard.agent.stages.s5_report (a later stage)"
    ]
    # a stage's folder imports its own helpers and earlier stages; its helpers no later stage
    assert stage_imports_later_stage(stages / "s4_score" / "__init__.py") == []
    assert stage_imports_later_stage(stages / "s4_score" / "memo.py") == [
        "memo.py:3 imports gpuguard.agent.stages.s6_act.outcomes (a later stage)"
    ]
    assert writes_to_correlation_state(stages / "s5_report.py") == [
        "s5_report.py:2 writes .verdict",
        "s5_report.py:3 writes .facts_gen",
    ]


# -- the kernel's maps are read inside sources/ebpf -------------------------------------------------

# Packages that take the sensor's kernel maps as an argument (sources/ebpf gives them an object
# such as activity_map.ActivityMap): they import neither sources.ebpf nor bcc, and index no
# bcc table by its name (``bpf[b"conn_activity"]``).
KERNEL_MAP_FREE = ("sources/net",)


def kernel_map_reads(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    where = path.relative_to(PACKAGE.parent)
    found = [
        f"{where}:{line}: imports {module}"
        for line, module in imported_modules(path)
        if module.startswith("gpuguard.sources.ebpf")
    ]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
            found += [
                f"{where}:{node.lineno}: imports {n}"
                for n in names
                if n and (n == "bcc" or n.startswith("bcc."))
            ]
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, bytes)
        ):
            found.append(f"{where}:{node.lineno}: reads the kernel map {node.slice.value!r}")
    return found


KERNEL_MAP_FREE_MODULES = sorted(p for d in KERNEL_MAP_FREE for p in (PACKAGE / d).rglob("*.py"))


@pytest.mark.parametrize(
    "path",
    KERNEL_MAP_FREE_MODULES,
    ids=[str(p.relative_to(PACKAGE)) for p in KERNEL_MAP_FREE_MODULES],
)
def test_only_sources_ebpf_reads_the_sensors_kernel_maps(path):
    assert kernel_map_reads(path) == []


def test_the_kernel_map_check_catches_an_import_and_a_table_read(tmp_path, monkeypatch):
    fake = tmp_path / "gpuguard"
    (fake / "sources" / "net").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    bad = fake / "sources" / "net" / "reader.py"
    bad.write_text(
        "from gpuguard.sources.ebpf.kernel_maps import slot_index\nimport bcc.table\n"
        "def f(bpf):\n    return bpf[b'conn_activity'], bpf['not a map name']\n"
    )
    monkeypatch.setattr(__import__(__name__), "PACKAGE", fake)
    assert [v.split(": ", 1)[1] for v in kernel_map_reads(bad)] == [
        "imports gpuguard.sources.ebpf.kernel_maps",
        "imports bcc.table",
        "reads the kernel map b'conn_activity'",
    ]


# -- small modules ----------------------------------------------------------------------------------

MAX_MODULE_LINES = 600
# Long because of what they list, not of what they do.
DATA_TABLES = {"events/ioctl_names.py"}


def module_lines(path: Path) -> int:
    return len(path.read_text().splitlines())


SIZED_MODULES = [p for p in MODULES if str(p.relative_to(PACKAGE)) not in DATA_TABLES]


@pytest.mark.parametrize(
    "path", SIZED_MODULES, ids=[str(p.relative_to(PACKAGE)) for p in SIZED_MODULES]
)
def test_each_module_is_under_the_size_limit(path):
    lines = module_lines(path)
    assert lines <= MAX_MODULE_LINES, (
        f"{path.relative_to(PACKAGE)} has {lines} lines (at most {MAX_MODULE_LINES}): split it by "
        "job (a data table goes in DATA_TABLES)"
    )


def test_the_size_exceptions_are_still_needed():
    for name in sorted(DATA_TABLES):
        path = PACKAGE / name
        assert path.is_file(), f"{name} is gone: strike it from the size exceptions"


# -- gpuguard/sources: its folders point one way ----------------------------------------------------

# Each folder of sources imports only folders listed before it (and modules of sources itself);
# with no circle between modules, a fact flows up: /proc, then the network and the GPU samplers,
# then the sensor, then host-wide looks.
SOURCES_FOLDERS = ("proc", "net", "gpu", "ebpf", "host")


def sources_folder_problems() -> list[str]:
    """Arrows back up between the folders of sources, and circles between its modules."""
    graph = import_graph("sources")
    found = [f"circle: {' <-> '.join(c)}" for c in circles(graph)]
    for module, targets in sorted(graph.items()):
        own = module.split(".")[2] if module.count(".") >= 3 else None
        for target in sorted(targets):
            other = target.split(".")[2] if target.count(".") >= 3 else None
            if own in SOURCES_FOLDERS and other in SOURCES_FOLDERS and own != other:
                if SOURCES_FOLDERS.index(other) > SOURCES_FOLDERS.index(own):
                    found.append(f"{module} imports {target}: {own} is below {other}")
    return found


def test_sources_folders_point_one_way_with_no_circle():
    folders = {p.name for p in (PACKAGE / "sources").iterdir() if (p / "__init__.py").is_file()}
    assert folders == set(SOURCES_FOLDERS), "place a new folder of sources in SOURCES_FOLDERS"
    assert sources_folder_problems() == []
