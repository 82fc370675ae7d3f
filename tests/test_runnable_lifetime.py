"""The lifetime view of runnable threads (schedstat) that scan's CPU-miner rules read: a niced
spinner starved on a busy host still counts as spinning, a sleeper does not (real processes).

The busy host is the test's own: the spinner and its two hogs share a cpu cgroup of their own,
weighing three tasks, so the spinner's share is set by its own hogs, not by whatever else
the run has going (it once flaked beside the busy-worker test when all of them shared the
load group; it then held the host lock alone, and every worker that reached a host mutator
while it ran, or it while they ran, sat idle)."""

from __future__ import annotations

import subprocess
import time

import psutil
import pytest

from gpuguard.sources.proc.process import collect_process_facts
from tests.support.load import own_cpu_group, start_in_load_group
from tests.support.randomx import cpu_hog, stop
from tests.support.runnable import lifetime_runnable


@pytest.mark.root
@pytest.mark.host_mutator  # CPU hogs
def test_a_niced_spinner_on_a_busy_host_stays_runnable_while_a_sleeper_does_not():
    # a shell loop, not Python: an interpreter's start-up reads files, and on a host busy with
    # disk I/O that wait (not runnable) would be part of its lifetime.  The same commands run
    # once first, so their pages are in memory (twice, in a CI run, the start-up's page-ins on a
    # loaded host left the spinner 0.87-0.89 runnable over 8 s); it lives 12 s.
    subprocess.run(["nice", "-n", "19", "sh", "-c", ":"], check=True)
    procs: list[subprocess.Popen] = []
    with own_cpu_group(3) as group:
        try:
            spinner = start_in_load_group(["nice", "-n", "19", "sh", "-c", "while :; do :; done"])
            procs += [spinner, cpu_hog(60), cpu_hog(60)]
            for proc in procs if group is not None else ():
                group.write_text(str(proc.pid))
            sleeper = subprocess.Popen(["sleep", "60"])
            procs.append(sleeper)
            time.sleep(12)
            spun, from_facts = _best_read(spinner.pid)
            slept = lifetime_runnable(sleeper.pid)
        finally:
            for proc in procs:
                stop(proc)
    assert spun is not None and spun.spinning_threads == 1, spun
    assert spun.spin_span_s >= 5 and spun.runnable_max >= 0.9, spun
    # nice 19 beside two nice-0 hogs on two cores: it ran a small share of what it wanted
    assert spun.ran_share is not None and spun.ran_share < 0.5, spun
    assert slept is not None and slept.spinning_threads == 0 and slept.runnable_max < 0.5, slept
    assert lifetime_runnable(2**22 + 4321) is None  # no such process
    assert from_facts is not None and from_facts.spinning_threads == 1, from_facts
    assert abs(from_facts.spin_span_s - spun.spin_span_s) <= 1.0, (from_facts, spun)


def _best_read(pid: int) -> tuple:
    """(from its own start, from the facts' start) of the read that saw ``pid`` most runnable.

    A read while the starved spinner waits on a run queue misses that wait (schedstat adds it
    when the task next runs): on a loaded host one read saw 0.71.  The best of a few reads 0.2 s
    apart is the spinner's share (a known limit of one read, issue 40's note).  scan passes the
    start from the facts (psutil's boot time + ticks) instead of a read."""
    start_after_boot_s = collect_process_facts(pid).start_time - psutil.boot_time()
    reads = []  # read at the same moment
    for _ in range(10):
        reads.append(
            (
                lifetime_runnable(pid),
                lifetime_runnable(pid, start_after_boot_s=start_after_boot_s),
            )
        )
        time.sleep(0.2)
    return max(reads, key=lambda pair: pair[0].runnable_max if pair[0] is not None else -1.0)
