"""tests/support/load.py: the host tests' busy workloads run in the low-weight load group, each
still under its own pid, path and command line."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from tests.support import load
from tests.support.randomx import cpu_hog, stop


@pytest.mark.root
@pytest.mark.self_contained
def test_a_hog_runs_in_the_load_group_as_itself():
    procs = load.load_group()
    assert procs is not None, "this machine has a CPU controller (platform.md)"
    knob = "cpu.weight" if procs.parent.parent == Path("/sys/fs/cgroup") else "cpu.shares"
    expected = load.V2_WEIGHT if knob == "cpu.weight" else load.V1_SHARES
    assert (procs.parent / knob).read_text().strip() == expected
    hog = cpu_hog(30)
    try:
        deadline = time.monotonic() + 10  # until the shell has joined the group and exec'd
        while time.monotonic() < deadline and os.readlink(
            f"/proc/{hog.pid}/exe"
        ) != os.path.realpath(sys.executable):
            time.sleep(0.01)
        assert os.readlink(f"/proc/{hog.pid}/exe") == os.path.realpath(sys.executable)
        assert Path(f"/proc/{hog.pid}/cmdline").read_bytes().split(b"\0")[1] == b"-c"
        assert load.pid_in_load_group(hog.pid)
        assert str(hog.pid) in procs.read_text().split()
    finally:
        stop(hog)
    assert not load.pid_in_load_group(os.getpid())  # the test itself is not in it


def test_without_a_cpu_controller_the_command_runs_as_given(monkeypatch):
    monkeypatch.setattr(load, "load_group", lambda: None)
    assert load.in_load_group(["/bin/true", "x"]) == ["/bin/true", "x"]
