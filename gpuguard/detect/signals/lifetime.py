"""Rule signals of time: a process's age, the hour it is evaluated at, whether it exited."""

from __future__ import annotations

import time

from gpuguard.correlate.state import ProcessState
from gpuguard.detect.signals.definition import signal


@signal(
    "age_s",
    "number",
    "time",
    "seconds since the process started",
    reads=("key", "now"),
    period_s=60.0,
)
def age_s(s: ProcessState, now: float) -> float:
    return max(0.0, now - s.key.start_time)


@signal(
    "hour_of_day",
    "number",
    "time",
    "hour (0-23, UTC) at evaluation time",
    reads=("now",),
    period_s=3600.0,
)
def hour_of_day(s: ProcessState, now: float) -> int | None:
    try:
        return time.gmtime(now).tm_hour
    except (OverflowError, ValueError, OSError):  # a replayed clock can hold any number
        return None


@signal("exited", "bool", "time", "the process has exited", reads=("exited_at",))
def exited(s: ProcessState, now: float) -> bool:
    return s.exited_at is not None
