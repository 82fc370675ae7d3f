"""The test suite's own shape: helpers live in tests/support, every test has exactly one tier."""

from __future__ import annotations

import ast
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.support.unprivileged import as_nobody, closed_directory, reach_steps

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent


def _imported_modules(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
    return found


def test_no_module_imports_a_test_module():
    """Shared helpers and fixtures live in tests/support (or conftest.py), never in a test file:
    importing one test file from another runs its module-level set-up twice under two names."""
    sources = [
        *TESTS.glob("*.py"),
        *TESTS.glob("support/*.py"),
        *(REPO / "benchmarks").glob("*.py"),
    ]
    offending = [
        f"{path.relative_to(REPO)}:{line} imports {module}"
        for path in sources
        for line, module in _imported_modules(path)
        if module.split(".")[-1].startswith("test_") and module.split(".")[0] in ("tests", module)
    ]
    assert offending == [], "move the helper into tests/support/<topic>.py:\n" + "\n".join(
        offending
    )


def test_support_modules_hold_no_tests_and_say_what_they_hold():
    for path in sorted((TESTS / "support").glob("*.py")):
        tree = ast.parse(path.read_text())
        assert ast.get_docstring(tree), f"{path.name}: no module docstring"
        tests = [
            n.name
            for n in tree.body
            if isinstance(n, ast.FunctionDef | ast.ClassDef) and n.name.lower().startswith("test")
        ]
        assert tests == [], f"{path.name} holds {tests}: tests belong in tests/test_*.py"


def test_every_collected_test_has_exactly_one_tier(request):
    from tests.conftest import TIERS

    items = request.session.items
    assert items, "run inside a collected session"
    wrong = [
        (item.nodeid, [t for t in TIERS if item.get_closest_marker(t)])
        for item in items
        if len([t for t in TIERS if item.get_closest_marker(t)]) != 1
    ]
    assert wrong == []


def test_the_tier_rule():
    """e2e: the file starts gpuguard as a program (or an agent fixture); kernel: other root
    tests; unit: the rest.  Checked on this run's own files, which the rule must place so."""
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:xdist", "-m", "unit"]
        + [
            f"tests/{name}"
            for name in ("test_signals.py", "test_sensor_root.py", "test_scan_cli.py")
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    collected = {line.split("::")[0] for line in out.stdout.splitlines() if "::" in line}
    assert collected == {"tests/test_signals.py"}, out.stdout[-2000:] + out.stderr[-2000:]
    from tests.conftest import E2E_SIGNS

    assert E2E_SIGNS.search('[sys.executable, "-m", "gpuguard", "scan"]')
    assert E2E_SIGNS.search("from tests.support.agent_run import AgentProcess")
    assert not E2E_SIGNS.search("from gpuguard.commands import scan")  # in this process


@pytest.mark.root
@pytest.mark.self_contained
def test_nobody_reaches_a_checkout_behind_a_directory_closed_to_it():
    """tests/support/unprivileged.py: a file under a 0700 directory is out of nobody's reach
    with plain setpriv, and within it through as_nobody's namespace; the host's view is unchanged."""
    with tempfile.TemporaryDirectory(prefix="gg-reach-") as tmp:  # (pytest's tmp_path is 0700)
        _reach_behind(Path(tmp))


def _reach_behind(top: Path) -> None:
    closed = top / "closed"
    inner = closed / "checkout"
    inner.mkdir(parents=True)
    (inner / "hello").write_text("hi\n")
    for d in (top, inner):
        d.chmod(0o755)
    closed.chmod(0o700)
    assert closed_directory(inner) == closed
    cat = ["cat", str(inner / "hello")]
    plain = subprocess.run([*as_nobody(reach=[]), *cat], capture_output=True, text=True)
    assert plain.returncode != 0 and "Permission denied" in plain.stderr
    assert reach_steps([inner]) is not None
    reached = subprocess.run([*as_nobody(reach=[inner]), *cat], capture_output=True, text=True)
    assert reached.returncode == 0 and reached.stdout == "hi\n", reached.stderr
    mounts = Path("/proc/self/mountinfo").read_text()
    assert str(closed) not in mounts  # the namespace's mounts stayed in it
    inner.chmod(0o700)
    with pytest.raises(RuntimeError, match="chmod o\\+rx"):
        reach_steps([inner])
