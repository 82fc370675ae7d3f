"""What the scan observes, source by source, on real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from gpuguard.events.model import Connect, GpuOpen
from gpuguard.sources.gpu.fd_holders import holders_of_pid
from gpuguard.sources.host.observation import observe_host
from gpuguard.sources.net.connections import read_connection_table
from gpuguard.sources.proc.hidden_pids import find_hidden_pids, list_proc_pids
from tests.support.scan import pool_listener, started_miner, stop


@pytest.mark.root
@pytest.mark.self_contained
def test_gpu_holders_seen_through_a_private_dev():
    with (
        tempfile.TemporaryDirectory(dir="/tmp") as tmp,
        pool_listener() as pool,
        started_miner(Path(tmp), pool.port) as miner,
    ):
        holders = holders_of_pid(miner["pid"])
        obs = observe_host(cpu_sample_s=0, gpu=False)
    by_class = {h.device_class: h for h in holders}
    assert set(by_class) == {"nvidia-ctl", "nvidia", "nvidia-uvm"}
    assert by_class["nvidia-uvm"].path == "/dev/nvidia-uvm"
    assert by_class["nvidia-uvm"].flags & os.O_ACCMODE == os.O_RDWR
    events = [e for e in obs.events() if e.pid == miner["pid"]]
    opens = sorted(e.path for e in events if isinstance(e, GpuOpen))
    assert opens == ["/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidiactl"]
    connects = [e for e in events if isinstance(e, Connect)]
    assert [(c.address, c.port, c.family) for c in connects] == [("127.0.0.1", pool.port, "ipv4")]
    assert all(e.comm == "kworker/0:2" for e in events)


def test_connections_mapped_to_their_pid():
    with pool_listener() as pool:
        client = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import socket,sys,time; s=socket.create_connection(('127.0.0.1', int(sys.argv[1])));"
                " print('up', flush=True); time.sleep(60)",
                str(pool.port),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert client.stdout.readline().strip() == "up"
            table = read_connection_table()
        finally:
            stop(client)
    remote = table.by_pid[client.pid]
    assert [(c.remote_address, c.remote_port, c.protocol, c.status) for c in remote] == [
        ("127.0.0.1", pool.port, "tcp", "ESTABLISHED")
    ]


def _schedstat(pid: int) -> tuple[float, float]:
    """(seconds on a CPU, seconds runnable but waiting in a run queue) from /proc/PID/schedstat."""
    with open(f"/proc/{pid}/schedstat") as f:
        run_ns, wait_ns, _slices = (int(v) for v in f.read().split())
    return run_ns / 1e9, wait_ns / 1e9


def test_cpu_use_measured_in_one_window_for_all_processes():
    """The busy loop's figure is the CPU the kernel gave it in the window, whatever share that is.

    On a loaded host the loop gets less than a core: what the test holds the scan to is the
    kernel's own count of its run time (schedstat), not a share only a quiet host gives."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    idle = subprocess.Popen(["sleep", "60"])
    try:
        time.sleep(0.2)  # past the interpreter's start-up: the loop itself
        run0, wait0 = _schedstat(busy.pid)
        started = time.monotonic()
        obs = observe_host(cpu_sample_s=0.5, gpu=False)
        bracket = time.monotonic() - started
        run1, wait1 = _schedstat(busy.pid)
    finally:
        stop(busy)
        stop(idle)
    assert obs.cpu_window_s >= 0.5
    ran, runnable = run1 - run0, (run1 - run0) + (wait1 - wait0)
    # the premise: the loop wanted a CPU the whole time (ran or waited for one)
    assert runnable >= 0.8 * bracket, (runnable, bracket)
    # the scan's figure is the kernel's run time over the window; the slack is what the
    # bracket around the scan holds beyond its window, and psutil's 10 ms clock ticks
    expected = 100 * ran / bracket
    slack = 100 * (bracket - obs.cpu_window_s) / obs.cpu_window_s + 10
    busy_percent = obs.facts[busy.pid].cpu_percent
    assert busy_percent > 0 and abs(busy_percent - expected) <= slack, (
        busy_percent,
        expected,
        slack,
    )
    assert obs.facts[idle.pid].cpu_percent == 0
    # ancestry comes from the same table: the busy child's parent is this test
    assert obs.facts[busy.pid].ancestors[0].pid == os.getpid()


def test_hidden_pid_probe_is_quiet_when_nothing_hides():
    listed = list_proc_pids()
    scan = find_hidden_pids(listed)
    assert scan.hidden == []
    assert scan.candidates_checked > 0


def test_reported_pid_that_exists_only_as_a_thread_is_not_hidden():
    # Thread ids answer /proc/<tid>/status but are not listed; Tgid tells them apart.
    import threading

    ready = threading.Event()
    stop_event = threading.Event()

    def worker() -> None:
        ready.set()
        stop_event.wait(10)

    thread = threading.Thread(target=worker)
    thread.start()
    ready.wait()
    try:
        tid = thread.native_id
        scan = find_hidden_pids(list_proc_pids(), reported={tid: "gpu:test"}, use_cgroups=False)
    finally:
        stop_event.set()
        thread.join()
    assert tid != os.getpid()
    assert scan.hidden == []
