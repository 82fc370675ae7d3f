"""The circuit breaker: a block killing too many processes not the offender's own must stop.

Each kill outside the offender's tree (and not an exact copy of its file) is counted for its
block; more than the limit within :data:`BREAKER_WINDOW_S` while the block is armed trips it,
and the caller suspends the block in the kernel (one write every entry checks).  A re-armed
block counts afresh.  The limits and why: docs/respond.md, "Safety".
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

BREAKER_WINDOW_S = 60.0


class Breaker:
    """Recent kills outside the offender's own, per block; thread-safe."""

    def __init__(self, limit: int, armed: Callable[[int], bool]) -> None:
        self.limit = limit
        self.armed = armed  # whether the block still acts in the kernel
        self._lock = threading.Lock()
        self._victims: dict[int, deque] = {}  # block number -> (when, pid, exe) of recent kills

    def count(self, number: int, pid: int, exe: str, now: float) -> list[dict] | None:
        """Count a kill of ``pid`` (monotonic ``now``); the victims when it trips the block, else None."""
        with self._lock:
            recent = self._victims.setdefault(number, deque())
            recent.append((now, pid, exe))
            while recent and now - recent[0][0] > BREAKER_WINDOW_S:
                recent.popleft()
            trip = len(recent) > self.limit and self.armed(number)
            victims = [{"pid": p, "exe": e} for _, p, e in recent]
            if trip:
                recent.clear()  # a re-armed block counts afresh
        return victims if trip else None

    def reset(self, number: int) -> None:
        """Forget the block's count (re-armed or lifted)."""
        with self._lock:
            self._victims.pop(number, None)
