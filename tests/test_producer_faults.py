"""A producer whose work keeps failing says so when it starts failing, then at most once per
``FAULT_REPEAT_S`` while it persists: a broken /proc sweep every half second does not flood
the log."""

from __future__ import annotations

import threading

from gpuguard.agent.counters import AgentCounters
from gpuguard.agent.intake import BoundedQueue
from gpuguard.agent.stages.s1_produce import producers
from gpuguard.events.agent_events import AgentLifecycle
from tests.support.agent_run import until


def _failing_sweeps(monkeypatch, sweeps: int) -> list[AgentLifecycle]:
    """The faults a sweep thread said over ``sweeps`` sweeps that each raised."""
    tried = []

    def broken_sweep(*args, **kwargs):
        tried.append(1)
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(producers, "sweep_once", broken_sweep)
    said: list[AgentLifecycle] = []
    stop = threading.Event()
    thread = producers.SweepThread(
        BoundedQueue(16), AgentCounters(), stop, said.append, lambda pid, start: False, 0.01
    )
    thread.start()
    try:
        until(lambda: len(tried) >= sweeps, timeout=10)
    finally:
        stop.set()
        thread.join(10)
    return said


def test_a_sweep_that_keeps_failing_is_said_once_per_repeat_interval(monkeypatch):
    said = _failing_sweeps(monkeypatch, 20)
    assert [f.action for f in said] == ["fault"]
    assert said[0].message == "/proc sweep failed: OSError: [Errno 5] Input/output error; retrying"
    assert said[0].detail == {"source": "sweep"}


def test_a_fault_still_there_after_the_repeat_interval_is_said_again(monkeypatch):
    monkeypatch.setattr(producers, "FAULT_REPEAT_S", 0.0)
    said = _failing_sweeps(monkeypatch, 5)
    assert len(said) >= 5 and {f.action for f in said} == {"fault"}
