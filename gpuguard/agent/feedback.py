"""Explicit queues that carry work back against the flow, drained by the stage that owns the target.

* later stages -> the sensor: ``("watch", pid)`` (activity records for a process's
  connections) and ``("interest", pid)`` (its later execs in full); the produce stage's sensor
  thread drains them before each poll, so only that thread touches the sensor;
* the responder's own threads -> the act stage: action outcomes that come later (SIGKILL
  after the grace, hook results, kill-on-touch kills); the loop drains them each turn.
"""

from __future__ import annotations

from collections import deque
from typing import Any


class FeedbackQueue:
    """Many producers, one consumer; ``put`` never blocks (deque appends are atomic)."""

    def __init__(self) -> None:
        self._items: deque = deque()
        self.put_total = 0  # how many were queued (a counter, not a depth)

    def __len__(self) -> int:
        return len(self._items)

    def put(self, item: Any) -> None:
        self._items.append(item)
        self.put_total += 1

    def drain(self) -> list[Any]:
        """Everything queued, oldest first."""
        items = self._items
        out = []
        while items:
            out.append(items.popleft())
        return out
