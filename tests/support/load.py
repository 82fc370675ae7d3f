"""Where the busy workloads of the host tests run: one CPU cgroup of low weight, and no huge
pages but those their own test reserved.

CPU hogs, miner stand-ins, a spinning JVM and database take the CPU the rest of the suite
leaves.  Among themselves they compete as before (a hog and a stand-in at nice 19 keep their
relative weights inside the group), so a test's "loaded host" is as loaded for its own
processes; the other tests of the run no longer lose most of two cores to them.  The rules
these tests exercise count runnable time (running plus waiting for a CPU), which a process
of low weight accrues all the same.

Host tests run beside each other, and the huge-page pool is one for the host: a stand-in
whose test reserved nothing would take the pages another test reserved for its own (and its
test would see a grant where it expects the refusal of a host without a pool).  So a
workload started while its test holds no reservation (tests/support/hugepages.py) joins a
hugetlb cgroup whose reservation limit is 0: its MAP_HUGETLB request is refused, as on a host
with an empty pool.

:func:`join_load_group` moves a started process (all its threads; what it starts later
follows) from the test process: a move can wait for an RCU grace period, and that wait is
then the test's, not a sleep in the workload's own lifetime.  Where a controller is missing
(or without root) that part of the move is skipped.

Exec floods (:func:`start_flood`) are the other kind of load: hundreds of short children a
second.  Where CPU is a cgroup v1 controller each would weigh an ordinary task, so a flood
shares one cpu group that weighs one task in all.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from tests.support.cgroup_start import in_cgroups
from tests.support.hugepages import reservation_open

NAME = "gpuguard-test-load"
FLOOD_NAME = "gpuguard-test-flood"
# cgroup v2 weights run 1..10000 (default 100); v1 shares 2..262144 (default 1024): a quarter of
# one ordinary task either way.  Lower starves a stand-in's pool session (a slice, then a wait
# of hundreds of milliseconds per competitor), which real miners on a busy host do not see.
V2_WEIGHT = "25"
V1_SHARES = "256"
V1_FLOOD_SHARES = "1024"  # a flood, all its processes together: one ordinary task
V1_CPU = Path("/sys/fs/cgroup/cpu")
_OWN = itertools.count()


@functools.cache
def _v2_root() -> Path | None:
    for root in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
        if (root / "cgroup.controllers").exists():
            return root
    return None


def _enable(directory: Path, controller: str) -> bool:
    if controller not in _read(directory / "cgroup.controllers").split():
        return False
    if controller not in _read(directory / "cgroup.subtree_control").split():
        (directory / "cgroup.subtree_control").write_text(f"+{controller}")
    return True


@functools.cache
def _groups() -> dict[str, Path]:
    """{"cpu": v1 cpu group's procs, "pages"/"no-pages": v2 leaves' procs}, what this host allows."""
    out: dict[str, Path] = {}
    if (V1_CPU / "cpu.shares").exists():
        try:
            (V1_CPU / NAME).mkdir(exist_ok=True)
            (V1_CPU / NAME / "cpu.shares").write_text(V1_SHARES)
            out["cpu"] = V1_CPU / NAME / "cgroup.procs"
        except OSError:
            pass
    root = _v2_root()
    if root is None:
        return out
    try:
        parent = root / NAME
        cpu = "cpu" not in out and _enable(root, "cpu")
        hugetlb = _enable(root, "hugetlb")
        parent.mkdir(exist_ok=True)
        if cpu:
            (parent / "cpu.weight").write_text(V2_WEIGHT)
        if hugetlb:
            _enable(parent, "hugetlb")
        for leaf in ("pages", "no-pages"):
            (parent / leaf).mkdir(exist_ok=True)
        limits = sorted((parent / "no-pages").glob("hugetlb.*.rsvd.max")) if hugetlb else []
        for limit in limits:
            limit.write_text("0")
        out["pages"] = parent / "pages" / "cgroup.procs"
        if limits:
            out["no-pages"] = parent / "no-pages" / "cgroup.procs"
    except OSError:
        pass
    return out


def join_load_group(pid: int, *, huge_pages: bool | None = None, low_weight: bool = True) -> None:
    """Move ``pid`` (a process this test started) into the load group; where no huge page can
    be reserved unless ``huge_pages`` (by default: whether this test holds a reservation).
    ``low_weight`` False: the huge-page rule alone, its CPU weight stays an ordinary task's (for
    a test that times how soon a workload's own progress is seen)."""
    if huge_pages is None:
        huge_pages = reservation_open()
    groups = _groups()
    targets = [groups.get("cpu") if low_weight else None]
    targets.append(groups.get("pages" if huge_pages else "no-pages"))
    for procs in targets:
        if procs is None:
            continue
        try:
            procs.write_text(str(pid))
        except ProcessLookupError:
            return  # already gone: nothing to move


def start_in_load_group(argv: list[str], **popen_kwargs) -> subprocess.Popen:
    """``subprocess.Popen(argv, ...)``, moved into the load group at once."""
    proc = subprocess.Popen(argv, **popen_kwargs)
    join_load_group(proc.pid)
    return proc


@functools.cache
def _flood_group() -> Path | None:
    """The v1 cpu group floods run in (one ordinary task's shares), or None where CPU is not a
    v1 controller (a flood in a cgroup v2 directory of its own is one entity there already)."""
    if not (V1_CPU / "cpu.shares").exists():
        return None
    try:
        (V1_CPU / FLOOD_NAME).mkdir(exist_ok=True)
        (V1_CPU / FLOOD_NAME / "cpu.shares").write_text(V1_FLOOD_SHARES)
    except OSError:
        return None
    return V1_CPU / FLOOD_NAME / "cgroup.procs"


def start_flood(argv: list[str], cgroup: Path | None = None, **popen_kwargs) -> subprocess.Popen:
    """``argv``, an exec flood, in the cgroup v2 directory ``cgroup`` (when given) and, where CPU
    is a v1 controller (a hybrid host, such as this VM), in a cpu group of one ordinary task's
    weight, both from its first instruction.  There each of a flood's short-lived children
    would otherwise weigh a task of its own: 30 of them in flight held the rest of the run to a
    sliver of both cores (a probe compile beside one took 22 s of wall time for 1 s of CPU).
    A flood then runs at the rate one task's share allows; the flood tests wait for a count."""
    own = Path(cgroup) / "cgroup.procs" if cgroup is not None else None
    return subprocess.Popen(in_cgroups(argv, own, _flood_group()), **popen_kwargs)


@contextlib.contextmanager
def own_cpu_group(tasks: float = 1, cores: float | None = None) -> Iterator[Path | None]:
    """A cpu cgroup of this test's alone, weighing ``tasks`` ordinary tasks (0.25: the load
    group's weight, its own) and, with ``cores``, limited to that much of a CPU (a CFS quota
    over a 100 ms period): yields its ``cgroup.procs`` (None where there is no cpu controller
    to use), and removes it after, killing what is left.  Processes moved in compete with each
    other as on a host of their own, however busy the rest of the run keeps the load group."""
    name = f"gg-test-cpu-{os.getpid()}-{next(_OWN)}"
    period = 100_000
    quota = int(cores * period) if cores is not None else None
    group = None
    if (V1_CPU / "cpu.shares").exists():
        group = V1_CPU / name
        group.mkdir()
        (group / "cpu.shares").write_text(str(max(2, round(1024 * tasks))))
        if quota is not None:
            (group / "cpu.cfs_period_us").write_text(str(period))
            (group / "cpu.cfs_quota_us").write_text(str(quota))
    elif (root := _v2_root()) is not None and _enable(root, "cpu"):
        group = root / name
        group.mkdir()
        (group / "cpu.weight").write_text(str(max(1, round(100 * tasks))))
        if quota is not None:
            (group / "cpu.max").write_text(f"{quota} {period}")
    try:
        yield group / "cgroup.procs" if group is not None else None
    finally:
        if group is not None:
            _empty_and_remove(group)


def _empty_and_remove(group: Path) -> None:
    """Kill what is left in ``group`` (each by a pidfd, signalled only while the process it
    names is still in the group: a pid read from the list may be another's by then), then
    remove it."""
    procs = group / "cgroup.procs"
    deadline = time.monotonic() + 10
    while (pids := _read(procs).split()) and time.monotonic() < deadline:
        for pid in pids:
            try:
                fd = os.pidfd_open(int(pid))
            except ProcessLookupError:
                continue
            try:
                if pid in _read(procs).split():
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
            except ProcessLookupError:
                pass
            finally:
                os.close(fd)
        time.sleep(0.05)
    group.rmdir()


def load_cgroups(pid: int) -> set[str]:
    """The load groups ``pid`` is in ("cpu", "pages", "no-pages", "flood"), for the tests of this
    module."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return set()
    paths = {line.split(":", 2)[2] for line in lines if line.count(":") >= 2}
    names = {"cpu": f"/{NAME}", "pages": f"/{NAME}/pages", "no-pages": f"/{NAME}/no-pages"}
    names["flood"] = f"/{FLOOD_NAME}"
    return {name for name, path in names.items() if path in paths}


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
