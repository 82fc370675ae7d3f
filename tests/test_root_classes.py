"""tests/conftest.py's classes of root tests: each is grouped by how it shares the host, and a
root test that names no class (or two) stops the run with a message naming it and the choices."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# The project's conftest, as a directory of new tests would get it, plus a hook that prints
# each collected test's xdist group (so the grouping is read without running xdist).
CONFTEST = """\
from tests.conftest import *  # noqa: F403 - the hooks under test


def pytest_collection_finish(session):
    for item in session.items:
        mark = item.get_closest_marker("xdist_group")
        print("GROUP", item.name, mark.args[0] if mark else None)
"""

CLASSIFIED = """\
import pytest


@pytest.mark.root
@pytest.mark.host_mutator
def test_reserves(): pass


@pytest.mark.root
@pytest.mark.host_observer
def test_reads(): pass


@pytest.mark.root
@pytest.mark.self_contained
def test_alone(): pass


def test_plain(): pass
"""


def _collect(tmp_path: Path, source: str) -> subprocess.CompletedProcess:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_new.py").write_text(source)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
        + ["-p", "no:xdist", "-W", "ignore::pytest.PytestUnknownMarkWarning", str(tmp_path)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_mutators_and_observers_share_one_group_and_self_contained_ones_a_group_per_file(
    tmp_path,
):
    out = _collect(tmp_path, CLASSIFIED)
    assert out.returncode == 0, out.stdout + out.stderr
    groups = dict(line.split()[1:] for line in out.stdout.splitlines() if line.startswith("GROUP"))
    assert groups == {
        "test_reserves": "root-host",
        "test_reads": "root-host",
        "test_alone": "root-test_new",
        "test_plain": "None",  # not a root test: xdist places it anywhere
    }


def test_a_root_test_without_exactly_one_class_stops_the_run_naming_it_and_the_choices(tmp_path):
    source = CLASSIFIED.replace("def test_plain(): pass", "") + (
        "\n\n@pytest.mark.root\n@pytest.mark.host_mutator\n@pytest.mark.self_contained\n"
        "def test_both(): pass\n\n\n@pytest.mark.root\ndef test_none(): pass\n"
    )
    out = _collect(tmp_path, source)
    assert out.returncode == 4, out.stdout + out.stderr  # a usage error: nothing ran
    (line,) = [line for line in out.stderr.splitlines() if "do not say how" in line]
    assert line.startswith("ERROR: 2 root tests do not say how they share the host (")
    assert "test_new.py::test_both" in line and "test_new.py::test_none" in line
    assert "test_alone" not in line and "test_reserves" not in line
    for name in ("host_mutator", "host_observer", "self_contained"):
        assert f"@pytest.mark.{name}: " in line
    assert "fix: mark each with exactly one of" in line
