"""The FPU probe's gate: threads that hardly sleep found cheaply (a fake /proc), and the probe
detached and attached again on the real kernel with its counts kept."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from gpuguard.sources.ebpf.fpu_probe import FpuProbe
from gpuguard.sources.proc import busy
from gpuguard.sources.proc.busy import SpinWatch

TICKS = os.sysconf("SC_CLK_TCK")


class FakeProc:
    """A /proc with the files SpinWatch reads: uptime, stat, PID/stat, PID/task/TID/*."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.uptime = 1000.0
        self.host_busy = 0  # ticks

    def write_host(self) -> None:
        (self.root / "uptime").write_text(f"{self.uptime:.2f} 0.00\n")
        (self.root / "stat").write_text(f"cpu  {self.host_busy} 0 0 100000 0 0 0 0 0 0\n")

    def process(
        self, pid: int, cpu_s: float, start_s: float, run_s: float, sleeps: int, kthread=False
    ) -> None:
        d = self.root / str(pid)
        (d / "task" / str(pid)).mkdir(parents=True, exist_ok=True)
        flags = 0x00200000 if kthread else 0
        fields = ["S", "1", "1", "1", "0", "-1", str(flags), "0", "0", "0", "0"]
        fields += [str(int(cpu_s * TICKS)), "0", "0", "0", "20", "0", "1", "0"]
        fields += [str(int(start_s * TICKS))]
        (d / "stat").write_text(f"{pid} (x) " + " ".join(fields) + " 0 0\n")
        task = d / "task" / str(pid)
        (task / "schedstat").write_text(f"{int(run_s * 1e9)} 0 1\n")
        (task / "status").write_text(f"Name:\tx\nvoluntary_ctxt_switches:\t{sleeps}\n")


def test_a_quiet_host_costs_one_read_and_a_spinner_is_found_but_a_ping_pong_is_not(tmp_path):
    proc = FakeProc(tmp_path)
    proc.write_host()
    # a spinner (a core for 100 s, 5 sleeps), a ping-pong (as busy, blocking 40k times a
    # second) and a busy kernel thread
    proc.process(10, cpu_s=100, start_s=900, run_s=100, sleeps=5)
    proc.process(11, cpu_s=100, start_s=900, run_s=100, sleeps=4_000_000)
    proc.process(12, cpu_s=100, start_s=900, run_s=100, sleeps=0, kthread=True)
    watch = SpinWatch(str(tmp_path))
    assert watch.candidates() == [10]  # first look: lifetimes
    # 10 s on which the host did almost nothing: no process is read
    proc.uptime += 10
    proc.host_busy += int(0.1 * 10 * TICKS)
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
    watch = SpinWatch(str(tmp_path))
    assert watch.candidates() == []
    proc.uptime += busy.MIN_AGE_S * 5
    proc.host_busy += 10 * TICKS
    proc.write_host()
    proc.process(20, cpu_s=5.5, start_s=999.5, run_s=5.5, sleeps=0)
    assert watch.candidates() == [20]


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
