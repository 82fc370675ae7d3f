"""The FPU probe's gate: threads that hardly sleep found cheaply (a fake /proc), a thread held
to a tenth of a core by a CFS quota found on the real kernel, and the probe detached and
attached again on the real kernel with its counts kept."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from gpuguard.sources.ebpf.fpu_probe import FpuProbe
from gpuguard.sources.proc import busy
from gpuguard.sources.proc.busy import SpinWatch
from tests.support.load import own_cpu_group
from tests.support.randomx import stop
from tests.support.workloads import build_c_program

TICKS = os.sysconf("SC_CLK_TCK")


class FakeProc:
    """A /proc with the files SpinWatch reads: uptime, stat, loadavg, PID/stat, PID/task/TID/*."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.uptime = 1000.0
        self.host_busy = 0  # ticks
        self.runnable = 1  # threads runnable now (the agent's own look)

    def write_host(self) -> None:
        (self.root / "uptime").write_text(f"{self.uptime:.2f} 0.00\n")
        (self.root / "stat").write_text(f"cpu  {self.host_busy} 0 0 100000 0 0 0 0 0 0\n")
        (self.root / "loadavg").write_text(f"0.50 0.40 0.30 {self.runnable}/200 4242\n")

    def process(
        self,
        pid: int,
        cpu_s: float,
        start_s: float,
        run_s: float,
        sleeps: int,
        kthread=False,
        wait_s: float = 0.0,
    ) -> None:
        d = self.root / str(pid)
        (d / "task" / str(pid)).mkdir(parents=True, exist_ok=True)
        flags = 0x00200000 if kthread else 0
        fields = ["S", "1", "1", "1", "0", "-1", str(flags), "0", "0", "0", "0"]
        fields += [str(int(cpu_s * TICKS)), "0", "0", "0", "20", "0", "1", "0"]
        fields += [str(int(start_s * TICKS))]
        (d / "stat").write_text(f"{pid} (x) " + " ".join(fields) + " 0 0\n")
        task = d / "task" / str(pid)
        (task / "schedstat").write_text(f"{int(run_s * 1e9)} {int(wait_s * 1e9)} 1\n")
        (task / "status").write_text(f"Name:\tx\nvoluntary_ctxt_switches:\t{sleeps}\n")


def test_a_quiet_host_costs_one_read_and_a_spinner_is_found_but_a_ping_pong_is_not(tmp_path):
    proc = FakeProc(tmp_path)
    proc.write_host()
    # a spinner (a core for 100 s, 5 sleeps), a ping-pong (as busy, blocking 40k times a
    # second) and a busy kernel thread
    proc.process(10, cpu_s=100, start_s=900, run_s=100, sleeps=5)
    proc.process(11, cpu_s=100, start_s=900, run_s=100, sleeps=4_000_000)
    proc.process(12, cpu_s=100, start_s=900, run_s=100, sleeps=0, kthread=True)
    watch = SpinWatch(str(tmp_path), cpus=2)
    assert watch.candidates() == [10]  # first look: lifetimes
    # 10 s on which the host did almost nothing (0.02 of a core): no process is read
    proc.uptime += 10
    proc.host_busy += int(0.02 * 10 * TICKS)
    proc.write_host()
    sweeps = watch.counts["process_sweeps"]
    assert watch.candidates() == []
    assert watch.counts["process_sweeps"] == sweeps
    # the spinner spins on (and may sleep a few times a second): found again
    proc.uptime += 10
    proc.host_busy += 2 * 10 * TICKS
    proc.write_host()
    proc.process(10, cpu_s=110, start_s=900, run_s=110, sleeps=50)
    proc.process(11, cpu_s=110, start_s=900, run_s=110, sleeps=4_400_000)
    assert watch.candidates(ignore=99) == [10]
    assert watch.candidates(ignore=10) == []  # the agent itself never counts


def test_a_process_younger_than_a_second_waits_for_the_next_look(tmp_path):
    proc = FakeProc(tmp_path)
    proc.write_host()
    proc.process(20, cpu_s=0.5, start_s=proc.uptime - 0.5, run_s=0.5, sleeps=0)
    watch = SpinWatch(str(tmp_path), cpus=2)
    assert watch.candidates() == []
    proc.uptime += busy.MIN_AGE_S * 5
    proc.host_busy += 10 * TICKS
    proc.write_host()
    proc.process(20, cpu_s=5.5, start_s=999.5, run_s=5.5, sleeps=0)
    assert watch.candidates() == [20]


def test_a_thread_held_to_a_tenth_of_a_core_is_found_by_the_time_it_waited_for_its_quota(tmp_path):
    """Throttled by a quota or starved by heavier work, a spinner runs little but is runnable
    all along; a thread that ran as little and slept the rest is not a candidate, nor is a
    process too idle to be looked into."""
    proc = FakeProc(tmp_path)
    proc.write_host()
    watch = SpinWatch(str(tmp_path), cpus=2)
    watch.candidates()
    proc.uptime += 10
    proc.host_busy += int(0.5 * 10 * TICKS)
    proc.write_host()
    # 10 s old: ran 1 s, waited 8.9 s (a 0.1-core quota); ran 1 s, slept the rest (15/s)
    proc.process(30, cpu_s=1.0, start_s=proc.uptime - 10, run_s=1.0, wait_s=8.9, sleeps=3)
    proc.process(31, cpu_s=1.0, start_s=proc.uptime - 10, run_s=1.0, wait_s=0.1, sleeps=150)
    # a thread runnable all along that ran 0.3 s: too little to look into (0.03 of a core)
    proc.process(32, cpu_s=0.3, start_s=proc.uptime - 10, run_s=0.3, wait_s=9.6, sleeps=0)
    assert watch.candidates() == [30]
    assert not watch.contended and watch.counts["contended"] == 0
    # the next 10 s by the deltas: still waiting for its quota
    proc.uptime += 10
    proc.host_busy += int(0.5 * 10 * TICKS)
    proc.write_host()
    proc.process(30, cpu_s=2.0, start_s=proc.uptime - 20, run_s=2.0, wait_s=17.9, sleeps=6)
    assert watch.candidates() == [30]


def test_more_runnable_threads_than_cpus_is_said_and_a_quiet_host_is_never_contended(tmp_path):
    """A nice-19 miner among heavier work runs too little to be picked out, so a host with more
    runnable threads than CPUs says so (the agent attaches the probe while it lasts); a quiet
    host is not looked into at all, however its last instant looked."""
    proc = FakeProc(tmp_path)
    proc.write_host()
    watch = SpinWatch(str(tmp_path), cpus=2)
    watch.candidates()
    proc.uptime += 10
    proc.host_busy += 2 * 10 * TICKS
    proc.runnable = 7
    proc.write_host()
    assert watch.candidates() == [] and watch.contended
    assert watch.counts["contended"] == 1
    proc.uptime += 10
    proc.host_busy += int(0.01 * 10 * TICKS)
    proc.write_host()
    sweeps = watch.counts["process_sweeps"]
    assert watch.candidates() == [] and not watch.contended
    assert watch.counts["process_sweeps"] == sweeps
    proc.uptime += 10
    proc.host_busy += 2 * 10 * TICKS
    proc.runnable = 3  # two CPUs, two busy threads and the look itself
    proc.write_host()
    watch.candidates()
    assert not watch.contended


@pytest.mark.root
@pytest.mark.self_contained
def test_a_spinner_held_to_a_tenth_of_a_core_is_a_candidate_on_the_real_kernel():
    """The kernel counts a thread's wait for its CFS quota as run-queue wait (schedstat), so a
    spinner in a 0.1-core cgroup of this test's is found; its group weighs an ordinary task,
    so the rest of a busy run does not starve it below the quota."""
    spinner_c = Path(__file__).resolve().parent / "workloads" / "rounding_spinner.c"
    binary = build_c_program(spinner_c)
    with own_cpu_group(cores=0.1) as procs:
        assert procs is not None, "no cpu controller to hold the spinner to 0.1 of a core"
        spinner = subprocess.Popen([str(binary)], stdout=subprocess.PIPE)
        try:
            assert spinner.stdout.readline().strip() == b"ready"
            procs.write_text(str(spinner.pid))
            watch = SpinWatch()
            watch.candidates()
            time.sleep(3)
            assert spinner.pid in watch.candidates(), watch.counts
        finally:
            stop(spinner)


@pytest.mark.root
@pytest.mark.self_contained
def test_the_fpu_probe_detaches_and_attaches_again_keeping_its_counts():
    probe = FpuProbe.open()
    if not probe.loaded:
        pytest.fail(f"the FPU probe loads on this machine (platform.md): {probe.blind_spot}")
    try:
        assert probe.attached
        assert probe.set_attached(False) is False
        assert probe.set_attached(False) is False  # twice: nothing to do
        # a thread leaving round-to-nearest while detached is not seen
        code = (
            "import ctypes, time\n"
            "libm = ctypes.CDLL('libm.so.6')\n"
            "libm.fesetround(0x400)\n"  # FE_DOWNWARD
            "end = time.time() + 1.5\n"
            "while time.time() < end: time.sleep(0.001)\n"
        )
        quiet = subprocess.Popen(["python3", "-c", code])
        quiet.wait()
        assert quiet.pid not in probe.counts()
        assert probe.set_attached(True) is True
        assert probe.attaches == 1
        seen = subprocess.Popen(["python3", "-c", code])
        seen.wait()
        deadline = time.monotonic() + 5
        while seen.pid not in probe.counts() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert seen.pid in probe.counts()
    finally:
        probe.close()
