"""Rule signals of CPU use: the CPU % window and threads that stay runnable (schedstat)."""

from __future__ import annotations

from gpuguard.correlate.state import ProcessState
from gpuguard.detect.signals.definition import signal


@signal(
    "cpu_percent_mean",
    "number",
    "cpu",
    "mean CPU % (100 = one core), last 5 minutes",
    reads=("cpu",),
)
def cpu_percent_mean(s: ProcessState, now: float) -> float | None:
    return s.cpu.mean


@signal("cpu_window_s", "number", "cpu", "seconds covered by the CPU window", reads=("cpu",))
def cpu_window_s(s: ProcessState, now: float) -> float:
    return s.cpu.duration_s


# Runnable threads (schedstat), from the latest CpuActivity: the agent's look every housekeeping
# period, or scan's one lifetime read (its SSE rounding modes: detect.signals.rounding).


@signal(
    "cpu_spinning_threads",
    "number",
    "cpu",
    "threads runnable (on a CPU or queued for one, /proc/PID/task/*/schedstat) >= 90 % of their "
    "life or of the latest "
    "sampling interval; nice 19, a thread cap or a busy host do not lower it",
    reads=("cpu_activity",),
)
def cpu_spinning_threads(s: ProcessState, now: float) -> int | None:
    a = s.cpu_activity
    return a.spinning_threads if a is not None else None


@signal(
    "cpu_spin_s",
    "number",
    "cpu",
    "seconds over which a thread was measured spinning (its lifetime, or the sampling interval)",
    reads=("cpu_activity",),
)
def cpu_spin_s(s: ProcessState, now: float) -> float | None:
    a = s.cpu_activity
    return a.spin_span_s if a is not None and a.spinning_threads else None


@signal(
    "cpu_runnable_max",
    "number",
    "cpu",
    "highest runnable fraction of one thread (0-1)",
    reads=("cpu_activity",),
)
def cpu_runnable_max(s: ProcessState, now: float) -> float | None:
    a = s.cpu_activity
    return a.runnable_max if a is not None else None


@signal(
    "cpu_ran_share",
    "number",
    "cpu",
    "of its spinning threads' runnable time, the share they ran (1: had the CPUs; low: "
    "niced or crowded out, yet never sleeping)",
    reads=("cpu_activity",),
)
def cpu_ran_share(s: ProcessState, now: float) -> float | None:
    a = s.cpu_activity
    return a.ran_share if a is not None else None
