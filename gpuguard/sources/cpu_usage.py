"""CPU use of chosen processes between two looks, from /proc/PID/stat (utime + stime).

The agent has no per-process CPU window otherwise (the sensor sees syscalls, not time
on a CPU).  It samples only the processes a CPU-miner rule could need it for (huge-page
users and host tuners: ``Correlator.cpu_candidates``) once per housekeeping period, so
the cost is one small /proc read per candidate per period.
"""

from __future__ import annotations

import os
import time
from collections.abc import Hashable, Iterable

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int, proc_root: str = "/proc") -> float | None:
    """User + system CPU seconds the process has used so far; None if it is gone."""
    try:
        with open(f"{proc_root}/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICKS
    except (OSError, IndexError, ValueError):
        return None


class CpuSampler:
    """CPU % (100 = one core) of each process since the previous :meth:`sample` that included it."""

    def __init__(self, proc_root: str = "/proc") -> None:
        self.proc_root = proc_root
        self._last: dict[Hashable, tuple[float, float]] = {}  # key -> (cpu seconds, monotonic time)

    def sample(self, keys: Iterable[tuple[int, float]]) -> dict[tuple[int, float], float]:
        """``keys`` are (pid, start time) pairs; returns a percentage for those seen last time too."""
        now = time.monotonic()
        seen: dict[Hashable, tuple[float, float]] = {}
        out: dict[tuple[int, float], float] = {}
        for key in keys:
            used = cpu_seconds(key[0], self.proc_root)
            if used is None:
                continue
            seen[key] = (used, now)
            previous = self._last.get(key)
            if previous is not None and now > previous[1] and used >= previous[0]:
                out[key] = round(100.0 * (used - previous[0]) / (now - previous[1]), 1)
        self._last = seen  # processes no longer asked for are forgotten
        return out
