"""The agent's producers, each on its own thread, each feeding the intake queue.

* :class:`SensorThread` polls the eBPF sensor (it blocks in the ring buffer's
  epoll, never spins) and queues its events;
* :class:`SamplerThread` samples one GPU source at a steady rate, so a slow
  driver call (NVML's PCIe throughput sleeps 20 ms inside the call) delays only
  its own thread; a sampler that raises is reported and reopened with backoff;
  a source with accounting records (NVML accounting mode) also queues them, at
  the slower host-check interval;
* :class:`SweepThread` walks /proc (the observation ``scan`` uses) every few
  seconds in reduced mode; :func:`sweep_items` turns one walk into the items
  the correlator takes, and also seeds the correlator once at start.

Details: docs/internals.md, "producers".
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

from gpuguard.agent.counters import AgentCounters
from gpuguard.agent.feedback import FeedbackQueue
from gpuguard.agent.intake import BoundedQueue
from gpuguard.events.agent_events import AgentLifecycle
from gpuguard.events.gpu_snapshot import GpuSnapshot
from gpuguard.events.model import GpuOpen, Lost

Emit = Callable[[AgentLifecycle], None]
FAULT_REPEAT_S = 60.0  # a fault that persists is reported again this often
REOPEN_AFTER_FAILURES = 3  # consecutive raising samples before the sampler is reopened
MAX_BACKOFF_S = 60.0
# The sensor thread's longest wait for records: the sensor's periodic jobs (Sensor.wait_ms: the
# exec filter's 0.25 s turn while execs are pending, the drain, the sweep) end it sooner, and a
# stop or a request from a later stage wakes it (sources.ebpf.ring_wait).  A third of the health
# check's stall time at most: /healthz wants a poll at least that recent.
POLL_MS = 10_000


def _fault(emit: Emit, message: str, **detail: Any) -> None:
    emit(AgentLifecycle(time=time.time(), action="fault", message=message, detail=detail))


class _RepeatedFault:
    """A fault that may persist, said when first seen (or when ``first``) and then at most
    once per :data:`FAULT_REPEAT_S`."""

    def __init__(self, emit: Emit) -> None:
        self.emit = emit
        self._said_at = -math.inf

    def report(self, now: float, message: str, *, first: bool = False, **detail: Any) -> None:
        if first or now - self._said_at >= FAULT_REPEAT_S:
            self._said_at = now
            _fault(self.emit, message, **detail)


class SensorThread(threading.Thread):
    """Polls the sensor until ``stop`` is set, then drains it once more; before each poll it
    takes the feedback queue (watch and exec-interest requests)."""

    def __init__(
        self,
        sensor: Any,
        intake: BoundedQueue,
        counters: AgentCounters,
        stop: threading.Event,
        emit: Emit,
        feedback: FeedbackQueue | None = None,  # none: no later stage asks anything of it
        on_gpu_open: Callable[[], None] | None = None,
        *,
        stall_s: float,  # /healthz's stall time (the config's health_stall_s)
    ) -> None:
        super().__init__(name="gpuguard-sensor", daemon=True)
        self.poll_ms = max(1, min(POLL_MS, int(stall_s * 1000 / 3)))
        self.on_gpu_open = on_gpu_open  # called once per poll that saw a GPU device open
        self.sensor, self.intake, self.counters, self.stop, self.emit = (
            sensor,
            intake,
            counters,
            stop,
            emit,
        )
        # FeedbackQueue of ("watch" | "interest", pid) from later stages (gpuguard.agent.feedback)
        self.feedback = feedback
        self.polled_at: float | None = None  # monotonic time of the last completed poll (/healthz)
        self._exec_counts_read = 0  # the exec filter's counts last copied (they change each drain)

    def _queue(self, events: list) -> None:
        opened = False
        for event in events:
            self.counters.events_by_kind[event.kind] += 1
            if isinstance(event, Lost):
                self.counters.ring_lost[event.what] += event.count
            elif isinstance(event, GpuOpen):
                opened = True
        if opened and self.on_gpu_open is not None:
            self.on_gpu_open()  # idle GPU samplers go back to their full rate
        self.intake.put_many(events, "sensor")
        filt = getattr(self.sensor, "exec_filter", None)
        if filt is not None and filt.counts_read != self._exec_counts_read:
            self._exec_counts_read = filt.counts_read
            self.counters.execs = filt.summary()

    def _take_feedback(self) -> None:
        """Carry out what later stages asked of the sensor (this thread alone touches it)."""
        for kind, pid in self.feedback.drain():  # the stage's request woke this thread already
            if kind == "watch":
                self.sensor.request_watch(pid, wake=False)
            else:
                self.sensor.request_interest(pid, wake=False)

    def run(self) -> None:
        fault = _RepeatedFault(self.emit)
        while not self.stop.is_set():
            try:
                if self.feedback is not None and len(self.feedback):
                    self._take_feedback()
                self._queue(self.sensor.poll(self.poll_ms))
                self.polled_at = time.monotonic()
            except Exception as exc:  # noqa: BLE001 - the sensor thread must outlive one bad poll
                fault.report(
                    time.monotonic(),
                    f"sensor poll failed: {type(exc).__name__}: {exc}; retrying",
                    source="sensor",
                )
                self.stop.wait(1.0)
        try:
            self.sensor.detach_probes()  # the kernel's detach time overlaps the final drain
            self._queue(self.sensor.drain())
        except Exception as exc:  # noqa: BLE001
            _fault(
                self.emit,
                f"final sensor drain failed: {type(exc).__name__}: {exc}",
                source="sensor",
            )


# A GPU source whose samples say the same about idle GPUs (no process, no utilisation, memory
# as before) this many times in a row is sampled IDLE_FACTOR times less often, until a sample
# differs or a GPU device open seen by the sensor (SamplerThread.nudge) wakes it.  A sample that
# says the same as the one before is no news: it is queued without waking the detect loop, which
# takes it on its next turn (at most schedule.LOOP_WAIT_MAX_S, 2 s, later; one that differs
# wakes it).
QUIET_SAMPLES = 3
IDLE_FACTOR = 4


def quiet_view(snapshot: GpuSnapshot) -> tuple | None:
    """What two samples of idle GPUs share (None when a process uses one, or one is busy or
    lost): equal views mean nothing happened in between.  The source's error lines are part
    of it: a part that stays unavailable is no change, one that fails anew is."""
    if snapshot.processes:
        return None
    view: list = []
    for dev in snapshot.devices:
        if dev.gpu_util or dev.extra.get("state") == "lost":
            return None
        view.append((dev.vendor, dev.index, dev.memory_used))
    return (*view, *snapshot.errors)


class SamplerThread(threading.Thread):
    """Samples one GPU source every ``interval`` seconds (less often while its GPUs are idle
    and unchanged: :data:`QUIET_SAMPLES`); reopens it when it keeps raising."""

    def __init__(
        self,
        source: str,
        opener: Callable[[], Any],
        intake: BoundedQueue,
        counters: AgentCounters,
        stop: threading.Event,
        emit: Emit,
        interval: float = 1.0,
        reopen_s: float = 60.0,
        accounting_interval: float = 10.0,
        turn_accounting_on: bool = False,
    ) -> None:
        super().__init__(name=f"gpuguard-sampler-{source}", daemon=True)
        self.source, self.opener = source, opener
        self.intake, self.counters, self.stop, self.emit = intake, counters, stop, emit
        self.interval, self.reopen_s, self.accounting_interval = (
            interval,
            reopen_s,
            accounting_interval,
        )
        self._next_accounting = 0.0
        self.turn_accounting_on = (
            turn_accounting_on  # sampling.nvml_accounting: opt-in, it changes host state
        )
        self._accounting_pending = False  # set on each open, applied after its first sample
        self._accounting_fault = ""
        self.sampler: Any = None
        self.unavailable: str | None = None  # why the source cannot be opened here
        # an absent source's look at the hardware: no reopen (a library load, a sysfs walk)
        # while the devices that decided it are still the ones listed then
        self.hardware_same: Callable[[], bool] | None = None
        self.wake = threading.Event()  # set by nudge(): sample now, at the full rate
        self._quiet: tuple | None = None  # the last sample's quiet_view
        self.quiet_samples = 0  # samples in a row with that same view

    def nudge(self) -> None:
        """A GPU device was opened: back to the full rate, and a sample now if the source was
        being sampled at the idle rate (at the full rate the next tick is soon enough, and a
        burst of opens must not become a burst of samples)."""
        slow = self.quiet_samples >= QUIET_SAMPLES
        self.quiet_samples = 0
        if slow:
            self.wake.set()

    def _same_as_before(self, snapshot: GpuSnapshot | None) -> bool:
        """Whether ``snapshot`` says about idle GPUs what the one before said (no news); counts
        such samples in a row."""
        view = quiet_view(snapshot) if snapshot is not None else None
        same = view is not None and view == self._quiet
        self.quiet_samples = self.quiet_samples + 1 if same else 0
        self._quiet = view
        return same

    def _next_wait(self) -> float:
        """The interval to the next sample: longer after QUIET_SAMPLES equal idle samples."""
        if self.quiet_samples >= QUIET_SAMPLES:
            return self.interval * IDLE_FACTOR
        return self.interval

    def open(self) -> bool:
        """Open the source; a source that cannot work here is reported once (not a fault):
        ``source-absent`` when the host has no GPU it reads (information: every NVIDIA node lacks
        amdsmi), ``degraded`` when it has and the source still fails (the agent is blind there)."""
        from gpuguard.sources.gpu.sampler import SourceUnavailable

        self.hardware_same = None
        try:
            self.sampler = self.opener()
        except SourceUnavailable as exc:
            self.hardware_same = exc.hardware_same
            line = exc.one_line()
            said = ("absent: " if exc.absent else "") + line  # a GPU that appears is news
            if said != self.unavailable:
                self.emit(
                    AgentLifecycle(
                        time=time.time(),
                        action="source-absent" if exc.absent else "degraded",
                        message=f"GPU source {self.source}: {line}",
                        detail={"source": self.source, "gpus_present": not exc.absent},
                    )
                )
            self.unavailable = said
            return False
        except Exception as exc:  # noqa: BLE001 - a broken library must not stop the agent
            self.counters.sampler_errors[self.source] += 1
            _fault(
                self.emit,
                f"GPU source {self.source} failed to open: {type(exc).__name__}: {exc}; retrying",
                source=self.source,
            )
            return False
        self.unavailable = None
        self._accounting_pending = self.turn_accounting_on
        return True

    def _reopen(self) -> bool:
        """:meth:`open` again, unless the source was absent and the hardware is as it was."""
        if self.hardware_same is not None and self.hardware_same():
            return False
        return self.open()

    def _apply_accounting_mode(self) -> None:
        """Turn the driver's accounting mode on when configured to, and say what changed.  Once per open,
        after its first sample (the source knows its GPUs by then): a GPU that was reset or swapped
        comes back with it off."""
        self._accounting_pending = False
        switch = getattr(self.sampler, "set_accounting", None)
        if switch is None:
            return
        try:
            results = switch(True)
        except Exception as exc:  # noqa: BLE001 - accounting is extra evidence, never fatal
            results = [("failed", f"cannot turn accounting mode on: {type(exc).__name__}: {exc}")]
        outcomes = {outcome for outcome, _ in results}
        lines = [line for _, line in results]
        changed = "changed" in outcomes
        if changed or "failed" in outcomes:
            self.emit(
                AgentLifecycle(
                    time=time.time(),
                    action="host-change" if changed else "degraded",
                    message=f"GPU source {self.source}: sampling.nvml_accounting: "
                    + "; ".join(lines),
                    detail={"source": self.source, "accounting": lines},
                )
            )

    def _close(self) -> None:
        if self.sampler is not None:
            try:
                self.sampler.close()
            except Exception:  # noqa: BLE001 - closing a broken sampler is best effort
                pass
            self.sampler = None

    def _record(self, snapshot: GpuSnapshot, news: bool = True) -> None:
        for line in snapshot.errors:
            _fault(self.emit, f"GPU source {self.source}: {line}", source=self.source)
        gpus = self.counters.gpus
        for dev in snapshot.devices:
            gpus[(dev.vendor, dev.index)] = {
                "name": dev.name,
                "util": dev.gpu_util,
                "memory_used": dev.memory_used,
                "memory_total": dev.memory_total,
                "power_w": dev.power_w,
                "lost": dev.extra.get("state") == "lost",
            }
        self.intake.put(snapshot, "sampler", wake=news)

    def _read_accounting(self, now: float) -> None:
        """The driver's accounting records (running and exited pids; none when accounting mode is off)."""
        read = getattr(self.sampler, "accounting", None)
        if read is None or now < self._next_accounting:
            return
        self._next_accounting = now + self.accounting_interval
        try:
            records, errors = read()
        except Exception as exc:  # noqa: BLE001 - accounting is extra evidence, never fatal
            records, errors = [], [f"accounting read failed: {type(exc).__name__}: {exc}"]
        fault = "; ".join(errors)
        if fault and fault != self._accounting_fault:  # said once until it changes
            _fault(self.emit, f"GPU source {self.source}: {fault}", source=self.source)
        self._accounting_fault = fault
        if records:
            self.intake.put_many(records, "sampler")

    def run(self) -> None:
        failures = 0
        fault = _RepeatedFault(self.emit)
        backoff = self.interval
        next_open = 0.0
        next_tick = time.monotonic()
        while not self.stop.is_set():
            now = time.monotonic()
            if self.sampler is None:
                if now >= next_open and not self._reopen():
                    next_open = now + self.reopen_s
                if self.sampler is None:
                    self.stop.wait(max(0.05, min(self.reopen_s, next_open - now)))
                    continue
            cpu_before = time.thread_time()
            try:
                snapshot = self.sampler.sample()
            except Exception as exc:  # noqa: BLE001 - reported and retried, never fatal
                failures += 1
                self.counters.sampler_errors[self.source] += 1
                fault.report(
                    now,
                    f"GPU source {self.source} raised {type(exc).__name__}: {exc}; "
                    f"retrying (failure {failures})",
                    first=failures == 1,
                    source=self.source,
                    failures=failures,
                )
                if failures % REOPEN_AFTER_FAILURES == 0:
                    self._close()
                    backoff = min(backoff * 2, MAX_BACKOFF_S)
                    next_open = time.monotonic() + backoff
                snapshot = None
            else:
                if failures:
                    self.emit(
                        AgentLifecycle(
                            time=time.time(),
                            action="recovered",
                            message=f"GPU source {self.source} works again after {failures} failures",
                            detail={"source": self.source},
                        )
                    )
                failures, backoff = 0, self.interval
            finally:
                self.counters.sampler_seconds[self.source] += time.thread_time() - cpu_before
            same = self._same_as_before(snapshot)
            if snapshot is not None:
                self.counters.samples[self.source] += 1
                self._record(snapshot, news=not same)
                if self._accounting_pending:
                    self._apply_accounting_mode()
                self._read_accounting(now)
            next_tick += self._next_wait()
            wait = next_tick - time.monotonic()
            if wait < 0:  # a slow sample: skip the missed ticks instead of bursting
                next_tick = time.monotonic()
                wait = 0
            if self.wake.wait(wait):  # a nudge: sample now, the ticks count from here
                self.wake.clear()
                next_tick = time.monotonic()
        self._close()


def sweep_items(obs: Any, known: Callable[[int, float], bool]) -> list:
    """The correlator items of one /proc walk: facts of processes not yet tracked
    (``known(pid, start_time)``), then GPU-open and connect events for every process."""
    items: list = [
        f
        for f in sorted(obs.facts.values(), key=lambda f: (f.start_time, f.pid))
        if not known(f.pid, f.start_time)
    ]
    items.extend(obs.events())
    return items


class SweepThread(threading.Thread):
    """Reduced mode: a /proc walk every ``interval`` seconds, queued as correlator items."""

    def __init__(
        self,
        intake: BoundedQueue,
        counters: AgentCounters,
        stop: threading.Event,
        emit: Emit,
        known: Callable[[int, float], bool],
        interval: float = 3.0,
        proc_root: str = "/proc",
    ) -> None:
        super().__init__(name="gpuguard-sweep", daemon=True)
        self.intake, self.counters, self.stop, self.emit = intake, counters, stop, emit
        self.known, self.interval, self.proc_root = known, interval, proc_root

    def run(self) -> None:
        fault = _RepeatedFault(self.emit)
        while not self.stop.wait(self.interval):
            try:
                self.intake.put_many(sweep_once(self.counters, self.known, self.proc_root), "sweep")
            except Exception as exc:  # noqa: BLE001 - the next sweep may work
                fault.report(
                    time.monotonic(),
                    f"/proc sweep failed: {type(exc).__name__}: {exc}; retrying",
                    source="sweep",
                )


def sweep_once(
    counters: AgentCounters, known: Callable[[int, float], bool], proc_root: str = "/proc"
) -> list:
    """One /proc walk (no CPU window, no GPU sampling: the samplers run on their own)."""
    from gpuguard.sources.host.observation import observe_host

    started = time.perf_counter()
    obs = observe_host(cpu_sample_s=0.0, proc_root=proc_root, gpu=False)
    items = sweep_items(obs, known)
    counters.sweeps += 1
    counters.sweep_seconds += time.perf_counter() - started
    return items
