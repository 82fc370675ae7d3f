"""A bounded queue between stages that drops (and counts) instead of blocking the producer.

The sensor must never wait for the correlator: when the queue is full, what
does not fit is dropped and counted against its producer, and the detect loop
reports the drop as a lifecycle event.  The consumer waits on a condition
variable (no busy-waiting) and takes everything queued at once.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any


class BoundedQueue:
    """Many producers, one consumer; ``put_many`` never blocks."""

    def __init__(self, capacity: int, on_drop: Callable[[str, int], None] | None = None) -> None:
        self.capacity = capacity
        self._items: deque = deque()
        self._cond = threading.Condition()
        self._on_drop = on_drop
        self._closed = False
        self._news = False  # items that wake the consumer came since had_news() last asked

    def __len__(self) -> int:
        return len(self._items)

    def put_many(self, items: list[Any], producer: str, wake: bool = True) -> int:
        """Queue what fits; returns how many were dropped.  ``wake=False``: items that are no
        news wait for the consumer's next turn instead of waking it (each wake costs CPU)."""
        if not items:
            return 0
        with self._cond:
            room = self.capacity - len(self._items)
            kept = items if room >= len(items) else items[: max(room, 0)]
            self._items.extend(kept)
            dropped = len(items) - len(kept)
            if wake and kept:
                self._news = True
                self._cond.notify()
        if dropped and self._on_drop is not None:
            self._on_drop(producer, dropped)
        return dropped

    def put(self, item: Any, producer: str, wake: bool = True) -> bool:
        return self.put_many([item], producer, wake) == 0

    def take_all(self, timeout: float, limit: int | None = None) -> list[Any]:
        """Everything queued (at most ``limit`` items, oldest first), waiting up to ``timeout``
        seconds for the first item."""
        with self._cond:
            if not self._items and not self._closed:
                self._cond.wait(timeout)
            if limit is None or len(self._items) <= limit:
                out = list(self._items)
                self._items.clear()
                return out
            popleft = self._items.popleft
            return [popleft() for _ in range(limit)]

    def had_news(self) -> bool:
        """Whether items that wake the consumer (not ``wake=False`` ones) came since the last
        call: the detect loop's test for being idle."""
        with self._cond:
            news, self._news = self._news, False
        return news

    def nudge(self) -> None:
        """Wake a waiting consumer once (a reload); safe in a signal handler (the lock is an RLock)."""
        with self._cond:
            self._cond.notify_all()

    def wake(self) -> None:
        """Wake a waiting consumer (shutdown, a signal)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
