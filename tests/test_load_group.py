"""tests/support/load.py: the host tests' busy workloads run in the low-weight load group, each
under its own pid, path and command line, and take no huge page their test did not reserve;
an exec flood is in its own cgroup and, with all its children, weighs one task."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from gpuguard.sources.proc.process import collect_process_facts
from tests.support import load
from tests.support.cgroup_start import in_cgroups
from tests.support.hugepages import reservation_open, reserved_huge_pages
from tests.support.randomx import INSTALL_DIR, LoopbackPool, cpu_hog, start_standin, stop
from tests.support.touch_scope import scope_cgroup

MIB = 1 << 20


@pytest.mark.root
@pytest.mark.self_contained
def test_a_hog_runs_in_the_load_group_as_itself():
    hog = cpu_hog(30)
    try:
        assert os.readlink(f"/proc/{hog.pid}/exe") == os.path.realpath(sys.executable)
        assert load.load_cgroups(hog.pid) == {"cpu", "no-pages"}  # (v1 cpu, v2 hugetlb here)
        shares = Path("/sys/fs/cgroup/cpu", load.NAME, "cpu.shares").read_text()
        assert shares.strip() == load.V1_SHARES
    finally:
        stop(hog)
    assert load.load_cgroups(os.getpid()) == set()  # the test itself is not in it


@pytest.mark.root
@pytest.mark.host_mutator  # reserves huge pages
def test_a_standin_gets_huge_pages_only_where_its_test_reserved_them():
    """Free pages in the pool (here this test's own): a stand-in started as by a test without a
    reservation is refused them, as on a host without a pool; one of the reserving test maps them."""
    with tempfile.TemporaryDirectory(prefix="gg-load-") as tmp:
        pool = LoopbackPool(Path(tmp), tls=False)
        procs = []
        try:
            with reserved_huge_pages(8):
                assert reservation_open()
                refused = start_standin(pool, "metricsd", memory_mib=8, huge_pages=False)
                granted = start_standin(pool, "nodestatd", memory_mib=8)
                procs += [refused, granted]
                facts = {p.pid: collect_process_facts(p.pid) for p in procs}
                groups = {p.pid: load.load_cgroups(p.pid) for p in procs}
                for proc in procs:
                    stop(proc)
            assert not reservation_open()
        finally:
            for proc in procs:
                stop(proc)
            pool.close()
            shutil.rmtree(INSTALL_DIR, ignore_errors=True)
    assert facts[refused.pid].hugetlb_bytes == 0, facts[refused.pid]
    assert b"using ordinary pages" in refused.stderr.read()
    assert facts[granted.pid].hugetlb_bytes == 8 * MIB, facts[granted.pid]
    assert groups == {refused.pid: {"cpu", "no-pages"}, granted.pid: {"cpu", "pages"}}


@pytest.mark.root
@pytest.mark.self_contained
def test_a_flood_and_its_children_are_in_its_cgroup_and_the_flood_group_from_the_start():
    """Where CPU is a v1 controller (here) the flood's children share one cpu group of one
    task's shares; the cgroup v2 directory its test made holds them too, the first instruction
    included (the shell joins both, then execs)."""
    with scope_cgroup() as (name, cgroup):
        flood = load.start_flood(
            [
                "/bin/sh",
                "-c",
                f'sleep 30 & echo "$!"; grep -c :/{load.FLOOD_NAME}$ /proc/self/cgroup; wait',
            ],
            cgroup,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            child = int(flood.stdout.readline())
            own = flood.stdout.readline()  # a child's own look, before the test looks
            groups = {pid: load.load_cgroups(pid) for pid in (flood.pid, child)}
            v2 = Path(f"/proc/{child}/cgroup").read_text()
        finally:
            flood.kill()
            flood.wait()
    assert groups == {flood.pid: {"flood"}, child: {"flood"}}
    assert f"0::{name}\n" in v2
    assert own.strip() == "1"
    shares = Path("/sys/fs/cgroup/cpu", load.FLOOD_NAME, "cpu.shares").read_text()
    assert shares.strip() == load.V1_FLOOD_SHARES


def test_a_join_that_fails_runs_nothing(tmp_path):
    marker = tmp_path / "ran"
    argv = in_cgroups(["/bin/touch", str(marker)], tmp_path / "no-such-group" / "cgroup.procs")
    run = subprocess.run(argv, capture_output=True)
    assert run.returncode == 126 and not marker.exists()


@pytest.mark.root
@pytest.mark.self_contained
def test_an_own_cpu_group_weighs_its_tasks_and_takes_what_is_left_in_it_along():
    with load.own_cpu_group(tasks=3, cores=0.5) as procs:
        assert procs is not None
        group = procs.parent
        left = subprocess.Popen(["sleep", "60"])
        procs.write_text(str(left.pid))
        shares = (group / "cpu.shares").read_text().strip()
        quota = (group / "cpu.cfs_quota_us").read_text().strip()
    assert (shares, quota) == ("3072", "50000")
    assert left.wait(timeout=10) == -9  # killed on the way out
    assert not group.exists()
