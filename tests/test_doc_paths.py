"""Every mention of a gpuguard module in docs/, rules/, README.md, packaging/ and gpuguard's own
comments names one that exists: a regroup that moves a module cannot leave its old path behind.

Three forms are read, each outside code that merely looks alike:

* a path under the package, ``gpuguard/detect/signals/table.py`` or a folder
  ``gpuguard/detect/signals/``: it exists in the tree, or in the folders pyproject.toml maps
  into an installed package (``gpuguard/rules/`` is ``rules/``); ``/etc/gpuguard/...`` and
  other absolute paths are not the package's;
* a dotted name ``gpuguard.outputs.log_writer`` (or ``gpuguard.detect.scoring.engine.
  DetectionEngine``) whose second part is one of the package's own subpackages or modules:
  the longest part that is a module exists, and the next name, if any, is defined or
  imported at its top level.  ECS field names (``gpuguard.finding.id``) start with no module
  and are left alone;
* a bare file name ``errors.py`` or ``signals/table.py`` (docs, rules, packaging and
  README only; a hyphenated name is a program, not a module): some file of the tree ends so;
  and a module path without the ``gpuguard.`` prefix, ``detect.scoring.engine``, whose first
  part is one of the data-flow packages (``agent`` and ``config`` are left out: in prose they
  are more often a file, ``agent.yaml``, or a config key).
"""

from __future__ import annotations

import ast
import functools
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "gpuguard"
TREE_DIRS = ("gpuguard", "tests", "benchmarks", "packaging", "probes")
PROSE = [
    *sorted((ROOT / "docs").rglob("*.md")),
    ROOT / "README.md",
    *sorted(p for p in (ROOT / "rules").rglob("*") if p.is_file()),
    *sorted(p for p in (ROOT / "packaging").rglob("*") if p.is_file()),
]
CODE = sorted(PACKAGE.rglob("*.py"))
BARE_PACKAGES = ("sources", "detect", "outputs", "respond", "events", "correlate", "proving")

_PATH = re.compile(r"(?<![\w/.~$-])gpuguard/((?:\w+/)*\w+(?:\.py|/)?)")
_DOTTED = re.compile(r"(?<![\w/.-])gpuguard((?:\.[A-Za-z_]\w*)+)")
_FILE = re.compile(r"(?<![\w/.-])((?:\w+/)*[A-Za-z_]\w*\.py)\b")
_BARE = re.compile(r"(?<![\w/.-])((?:" + "|".join(BARE_PACKAGES) + r")(?:\.[a-z_]\w*)+)")


def _mapped_dirs() -> dict[str, Path]:
    """Package folders an installed copy gains from the checkout (pyproject's package-dir)."""
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())
    mapping = doc["tool"]["setuptools"]["package-dir"]
    return {
        name.removeprefix("gpuguard.").replace(".", "/") + "/": ROOT / folder
        for name, folder in mapping.items()
        if name.startswith("gpuguard.")
    }


MAPPED = _mapped_dirs()


def path_exists(rel: str) -> bool:
    """Whether ``gpuguard/<rel>`` is in the tree or in a folder an installed copy maps there."""
    if (PACKAGE / rel).exists():
        return True
    return any(
        (rel + "/").startswith(prefix) and (folder / rel[len(prefix) :]).exists()
        for prefix, folder in MAPPED.items()
    )


@functools.cache
def top_level_names(path: Path) -> frozenset[str]:
    """What a module defines or imports at its top level (its attributes a mention may name)."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {
                n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name)
            }
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return frozenset(names)


def _tree_files() -> list[str]:
    return [
        p.relative_to(ROOT).as_posix()
        for top in TREE_DIRS
        for p in (ROOT / top).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    ]


TREE_FILES = _tree_files()


def _module_file(parts: list[str]) -> Path | None:
    """The file of module ``gpuguard.<parts>``, or None."""
    base = PACKAGE.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def dotted_problem(name: str) -> str | None:
    """Why ``gpuguard.<name>`` names nothing, or None (also None: not a module mention)."""
    parts = name.split(".")
    if _module_file(parts[:1]) is None:
        return None  # gpuguard.finding.id and the like: a log field, not a module
    for end in range(len(parts), 0, -1):
        found = _module_file(parts[:end])
        if found is not None:
            rest = parts[end:]
            if rest and rest[0] not in top_level_names(found):
                return f"{rest[0]} is not in {found.relative_to(ROOT)}"
            return None
    return "no such module"  # unreachable: parts[:1] is a module


def mentions(path: Path, text: str) -> list[str]:
    """``file:line: mention (why)`` for each stale module mention in ``text``."""
    prose = path.suffix != ".py"
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        where = f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{number}"
        for match in _PATH.finditer(line):
            rel = match.group(1)
            if not path_exists(rel):
                out.append(f"{where}: gpuguard/{rel} (no such file or folder)")
        for match in _DOTTED.finditer(line):
            name = match.group(1)[1:]
            if name.endswith((".py", ".h", ".md", ".yaml")):
                continue
            why = dotted_problem(name)
            if why is not None:
                out.append(f"{where}: gpuguard.{name} ({why})")
        if not prose:
            continue
        for match in _FILE.finditer(line):
            name = match.group(1)
            if name.startswith("gpuguard/"):
                continue  # a path under the package: read above
            if not any(f == name or f.endswith("/" + name) for f in TREE_FILES):
                out.append(f"{where}: {name} (no file of the tree is named so)")
        for match in _BARE.finditer(line):
            name = match.group(1)
            if name.rsplit(".", 1)[-1] in ("py", "md", "yaml", "json"):
                continue
            why = dotted_problem(name)
            if why is not None:
                out.append(f"{where}: {name} ({why})")
    return out


@pytest.mark.parametrize("path", PROSE + CODE, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_mention_resolves(path):
    assert mentions(path, path.read_text()) == []


def test_the_files_are_read():
    assert len(PROSE) > 20 and len(CODE) > 150
    assert any(p.name == "miner-rules.yaml" for p in PROSE)


def test_a_stale_mention_of_each_form_is_caught(tmp_path):
    text = (
        "see gpuguard/detect/engine.py and gpuguard/sources/no_such/\n"
        "`gpuguard.detect.engine.DetectionEngine`, gpuguard.sources.host.no_such_module\n"
        "computed in behaviour_signals.py, by detect.engine, and sources.persistence\n"
        "gpuguard.detect.scoring.engine.NoSuchThing, gpuguard.escape.no_such_function\n"
    )
    found = mentions(tmp_path / "doc.md", text)
    assert [m.split(": ", 1)[1].split(" (")[0] for m in found] == [
        "gpuguard/detect/engine.py",
        "gpuguard/sources/no_such/",
        "gpuguard.detect.engine.DetectionEngine",
        "gpuguard.sources.host.no_such_module",
        "behaviour_signals.py",
        "detect.engine",
        "sources.persistence",
        "gpuguard.detect.scoring.engine.NoSuchThing",
        "gpuguard.escape.no_such_function",
    ], found


def test_live_mentions_and_look_alikes_pass(tmp_path):
    text = (
        "gpuguard/errors.py, gpuguard/detect/ruleset/, gpuguard/rules/, /etc/gpuguard/agent.yaml\n"
        "`gpuguard.outputs.log_writer`, gpuguard.detect.scoring.engine.DetectionEngine\n"
        "gpuguard.escape.escape_text, ECS `gpuguard.finding.id`, dataset gpuguard.scan\n"
        "outputs/jsonl.py, test_layers.py, dpdk-hugepages.py, outputs.log_writer, agent.yaml\n"
    )
    assert mentions(tmp_path / "doc.md", text) == []
