"""tests/conftest.py's classes of root tests: each is grouped by how it shares the host, and a
root test that names no class (or two) stops the run with a message naming it and the choices."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

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


def test_plain(): pass


@pytest.mark.root
@pytest.mark.host_observer
def test_reads(): pass


@pytest.mark.root
@pytest.mark.self_contained
def test_alone(): pass


@pytest.mark.root
@pytest.mark.host_mutator
def test_reserves(): pass
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


def test_root_tests_form_one_group_per_file(tmp_path):
    out = _collect(tmp_path, CLASSIFIED)
    assert out.returncode == 0, out.stdout + out.stderr
    groups = dict(line.split()[1:] for line in out.stdout.splitlines() if line.startswith("GROUP"))
    assert groups == {
        "test_reserves": "root-test_new",
        "test_reads": "root-test_new",
        "test_alone": "root-test_new",
        "test_plain": "None",  # not a root test: xdist places it anywhere
    }
    order = [line.split()[1] for line in out.stdout.splitlines() if line.startswith("GROUP")]
    # one group, with a mutator in it: the root tests first, in the file's order, then the rest
    assert order == ["test_reads", "test_alone", "test_reserves", "test_plain"]


# Each test notes its name in $ORDER as it runs.
NOTED = """\
import os
import pytest


def _note(name):
    with open(os.environ["ORDER"], "a") as out:
        out.write(name + "\\n")


{tests}
"""


def _noted(names_marks: list[tuple[str, str]]) -> str:
    tests = "\n\n".join(
        "".join(f"@pytest.mark.{m}\n" for m in marks.split())
        + f"def test_{name}():\n    _note({name!r})\n"
        for name, marks in names_marks
    )
    return NOTED.format(tests=tests)


@pytest.mark.root  # the root tests it runs are skipped without root
@pytest.mark.self_contained
def test_the_workers_take_mutator_groups_turn_about_with_the_largest_root_groups(tmp_path):
    """One xdist worker takes the work in the queue's order: the conftest's (a mutator's file,
    the largest other root file, the next mutator's, the next root file, then the rest), not
    xdist's own largest group first (the three-test file first, the mutators after it)."""
    (tmp_path / "conftest.py").write_text("from tests.conftest import *  # noqa: F403\n")
    files = {
        "test_a_plain.py": [("plain", "")],
        "test_b_small.py": [("small", "root self_contained")],
        "test_c_big.py": [(f"big{i}", "root self_contained") for i in range(3)],
        "test_d_long.py": [("long", "root host_mutator")],
        "test_e_mixed.py": [("mixed", "root self_contained"), ("hog", "root host_mutator")],
    }
    for name, tests in files.items():
        (tmp_path / name).write_text(_noted(tests))
    order = tmp_path / "order"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "1"]
        + ["--dist", "loadgroup", "-W", "ignore::pytest.PytestUnknownMarkWarning", str(tmp_path)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO), "ORDER": str(order)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    expected = ["long", "big0", "big1", "big2", "mixed", "hog", "small", "plain"]
    assert order.read_text().split() == expected


# The test notes when it starts and ends in $TIMES; with $MEET set it waits (up to 60 s) for
# that test to have started too, so two that may share the host must overlap.
TIMED = """\
import os, time
import pytest


@pytest.mark.root
@pytest.mark.CLASS
def test_timed():
    times, name, meet = os.environ["TIMES"], os.environ["NAME"], os.environ.get("MEET")
    with open(times, "a") as out:
        out.write(f"{name} start {time.monotonic()}\\n")
    deadline = time.monotonic() + 60
    while meet and f"{meet} start" not in open(times).read() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    with open(times, "a") as out:
        out.write(f"{name} end {time.monotonic()}\\n")
"""


@pytest.mark.root
@pytest.mark.self_contained  # its lock file is its own (GPUGUARD_TEST_HOST_LOCK)
def test_mutators_run_beside_each_other_and_an_observer_alone(tmp_path):
    times = tmp_path / "times"
    runs = []
    tests = [
        ("m1", "host_mutator", "m2"),
        ("m2", "host_mutator", "m1"),
        ("obs", "host_observer", ""),
    ]
    for name, cls, meet in tests:
        directory = tmp_path / name
        directory.mkdir()
        (directory / "conftest.py").write_text("from tests.conftest import *  # noqa: F403\n")
        (directory / "test_timed.py").write_text(TIMED.replace("CLASS", cls))
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "GPUGUARD_TEST_HOST_LOCK": str(tmp_path / "host.lock"),
            "TIMES": str(times),
            "NAME": name,
            "MEET": meet,
        }
        runs.append(
            subprocess.Popen(
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist"]
                + ["--require-root-tests", str(directory)],
                cwd=directory,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    for run in runs:
        output = run.communicate(timeout=120)[0]
        assert run.returncode == 0, output
    spans: dict[str, list[float]] = {}
    for line in times.read_text().splitlines():
        name, _, at = line.split()
        spans.setdefault(name, []).append(float(at))
    (m1_start, m1_end), (m2_start, m2_end), (obs_start, obs_end) = (
        spans["m1"],
        spans["m2"],
        spans["obs"],
    )
    for start, end in [(m1_start, m1_end), (m2_start, m2_end)]:
        assert end <= obs_start or start >= obs_end, spans  # never beside the observer
    # each mutator waited for the other inside the lock: they shared the host
    assert max(m1_start, m2_start) < min(m1_end, m2_end) - 0.4, spans


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
