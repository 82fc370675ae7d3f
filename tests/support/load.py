"""The busy workloads of the host tests (CPU hogs, miner stand-ins, a spinning JVM and database)
run in one CPU cgroup of low weight, so they take the CPU the rest of the suite leaves.

Among themselves they still compete as before (a hog and a stand-in at nice 19 keep their
relative weights inside the group), so a test's "loaded host" is as loaded for its own
processes; only the other tests of the run no longer lose most of two cores to them.  The
rules these tests exercise count runnable time (running plus waiting for a CPU), which a
process of low weight accrues all the same.

:func:`in_load_group` wraps a command line: a shell joins the group and execs the command, so
the workload's pid, parent, path and command line are its own and every thread or child it
starts is in the group.  Without a CPU controller (or without root) the command runs as given.
"""

from __future__ import annotations

import functools
from pathlib import Path

NAME = "gpuguard-test-load"
# cgroup v2 weights run 1..10000 (default 100); v1 shares 2..262144 (default 1024): a quarter of
# one ordinary task either way.  Lower starves a stand-in's pool session (a slice, then a wait
# of hundreds of milliseconds per competitor), which real miners on a busy host do not see.
V2_WEIGHT = "25"
V1_SHARES = "256"


@functools.cache
def load_group() -> Path | None:
    """The group's ``cgroup.procs`` (made once per host, shared by every run); None if unavailable."""
    candidates = []
    unified = Path("/sys/fs/cgroup")
    if "cpu" in _read(unified / "cgroup.subtree_control").split():
        candidates.append((unified / NAME, "cpu.weight", V2_WEIGHT))
    if Path("/sys/fs/cgroup/cpu/cpu.shares").exists():
        candidates.append((Path("/sys/fs/cgroup/cpu") / NAME, "cpu.shares", V1_SHARES))
    for directory, knob, value in candidates:
        try:
            directory.mkdir(exist_ok=True)
            (directory / knob).write_text(value)
        except OSError:
            continue
        return directory / "cgroup.procs"
    return None


def in_load_group(argv: list[str]) -> list[str]:
    """``argv`` run from inside the load group (``argv`` itself where there is none)."""
    procs = load_group()
    if procs is None:
        return list(argv)
    script = f'echo $$ > {procs} 2>/dev/null; exec "$@"'
    return ["/bin/sh", "-c", script, "sh", *argv]


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def pid_in_load_group(pid: int) -> bool:
    """Whether ``pid`` runs in the load group (for the tests of this module)."""
    try:
        return any(
            line.rsplit(":", 1)[-1].strip() == f"/{NAME}"
            for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        )
    except OSError:
        return False
