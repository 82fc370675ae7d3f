"""The agent's own costs: a stop under an exec flood is prompt, and the compiler's memory goes back after start-up."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from gpuguard.agent.memory import COMPILER_LIBRARIES, compiler_mappings, release_compiler_pages
from tests.support.agent_run import AgentProcess, lifecycle
from tests.support.load import start_flood
from tests.support.workloads import build_c_program

EXEC_FLOOD = Path(__file__).resolve().parent / "workloads" / "exec_flood.c"
STOP_WITHIN_S = (
    10.0  # "never wedged"; the 2 s target is measured in benchmarks/bench_stop.py --agent
)


@pytest.mark.root
@pytest.mark.self_contained
def test_sigterm_during_an_exec_flood_stops_the_agent_and_accounts_for_the_queue(tmp_path):
    flooder = build_c_program(EXEC_FLOOD)
    agent = AgentProcess(tmp_path)
    floods: list[subprocess.Popen] = []
    try:
        agent.wait_ready()
        floods = [
            start_flood([str(flooder), "0", "60"], stdout=subprocess.PIPE, text=True)
            for _ in range(2)
        ]
        agent.wait_status(lambda d: _execs_seen(d) > 2000, 30)
        sent = time.monotonic()
        agent.signal(signal.SIGTERM)
        agent.proc.wait(STOP_WITHIN_S)
        took = time.monotonic() - sent
    finally:
        for flood in floods:
            flood.terminate()
            flood.wait(10)
        agent.stop()
    assert agent.proc.returncode == 0, agent.stderr()
    assert took < STOP_WITHIN_S
    (stop,) = [r for r in agent.records() if lifecycle("stop")(r)]
    doc = agent.status()
    assert doc["running"] is False
    assert _execs_seen(doc) > 2000  # the flood was seen
    assert "stopped after" in stop["message"]


def _execs_seen(doc: dict) -> int:
    """Execs sent up in full plus those the sensor's exec filter kept (and counted) in the kernel."""
    counters = doc.get("counters", {})
    return counters.get("events_by_kind", {}).get("exec", 0) + counters.get("execs", {}).get(
        "aggregated", 0
    )


def test_the_loop_takes_bounded_batches_oldest_first():
    from gpuguard.agent.intake import BoundedQueue

    queue = BoundedQueue(100)
    queue.put_many(list(range(10)), "sensor")
    assert queue.take_all(0, 4) == [0, 1, 2, 3]
    assert queue.take_all(0, 4) == [4, 5, 6, 7]
    assert queue.take_all(0) == [8, 9] and len(queue) == 0


def _compiler_rss_kib() -> int:
    total, counting = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if head and not head[0].endswith(":"):
                counting = any(lib in line for lib in COMPILER_LIBRARIES)
            elif counting and head[0] == "Rss:":
                total += int(head[1])
    return total


def test_compiler_mappings_are_read_from_the_maps_text():
    maps = (
        "7f0000000000-7f0000100000 r-xp 00000000 08:01 123 /usr/lib/x86_64-linux-gnu/libLLVM-14.so.1\n"
        "7f0000100000-7f0000101000 rw-p 00100000 08:01 123 /usr/lib/x86_64-linux-gnu/libLLVM-14.so.1\n"
        "7f0000200000-7f0000300000 r-xp 00000000 08:01 124 /usr/lib/llvm-14/lib/libclang-cpp.so.14\n"
        "7f0000400000-7f0000500000 r-xp 00000000 08:01 125 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
        "7f0000600000-7f0000601000 rw-p 00000000 00:00 0\n"
    )
    assert compiler_mappings(maps) == [
        (0x7F0000000000, 0x100000),
        (0x7F0000100000, 0x1000),
        (0x7F0000200000, 0x100000),
    ]


@pytest.mark.root
@pytest.mark.self_contained
def test_the_compiler_pages_go_back_once_the_probes_are_loaded(monkeypatch):
    from gpuguard.sources.ebpf.probe_cache import ENV
    from gpuguard.sources.ebpf.probe_source import ProbeSettings
    from gpuguard.sources.ebpf.sensor import Sensor

    monkeypatch.setenv(ENV, "off")  # a start that compiles (a kernel's first)

    with Sensor(ProbeSettings(), drain_interval=0.5) as sensor:  # compiles with bcc's LLVM
        before = _compiler_rss_kib()
        assert before > 10_000  # the compile touched tens of MB of LLVM and clang
        assert release_compiler_pages() > 0
        after = _compiler_rss_kib()
        assert after < before / 2, (before, after)
        sensor.poll(10)  # the loaded probes still work
