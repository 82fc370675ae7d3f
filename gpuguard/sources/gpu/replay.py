"""Replay of recorded GPU telemetry: the GpuSnapshots of a recording, in order.

A recording (``gpuguard.events.wire``) interleaves events, process facts and
GPU snapshots.  :class:`ReplaySampler` hands out the snapshots one per
``sample()`` call, optionally paced by their recorded times, keeps the latest
:class:`ProcessFacts` per pid it passed on the way (so replayed pids keep
their names, users and containers), and raises :class:`EndOfRecording` when
the recording is exhausted.  Snapshots keep the ``source`` they were recorded
from ("nvml", "amdsmi", "drm-fdinfo").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from gpuguard.errors import GpuguardError
from gpuguard.events.gpu_snapshot import GpuSnapshot
from gpuguard.events.process_facts import ProcessFacts

SOURCE = "replay"


class EndOfRecording(Exception):
    """The recording has no more GPU snapshots."""


class ReplaySampler:
    """A :class:`GpuSampler` over a recording file."""

    source = SOURCE

    def __init__(
        self,
        path: str,
        pace: bool = False,
        speed: float = 1.0,
        sleep: Callable[[float], None] = time.sleep,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        # The reader says what is wrong with the path (missing, a directory, unreadable);
        # a pipe or FIFO is read like `gpuguard replay` reads it.
        from gpuguard.events.wire import iter_recording  # the wire format's one reader

        self.path = path
        self.process_facts: dict[int, ProcessFacts] = {}
        self.finished = False
        self._items = iter_recording(path)
        self._pace = pace
        self._speed = speed
        self._sleep = sleep
        self._monotonic = monotonic
        self._origin: tuple[float, float] | None = (
            None  # (recorded time, monotonic time) of the first snapshot
        )

    def sample(self) -> GpuSnapshot:
        """The next recorded snapshot; :class:`EndOfRecording` after the last."""
        if not self.finished:
            try:
                for item in self._items:
                    if isinstance(item, ProcessFacts):
                        self.process_facts[item.pid] = item
                    elif isinstance(item, GpuSnapshot):
                        self._wait_for(item.time)
                        return item
            except GpuguardError:  # RecordingDamaged: the reader already says where and why
                self.finished = True
                raise
            self.finished = True
        raise EndOfRecording(self.path)

    def __iter__(self) -> Iterator[GpuSnapshot]:
        while True:
            try:
                yield self.sample()
            except EndOfRecording:
                return

    def close(self) -> None:
        close = getattr(self._items, "close", None)
        if close is not None:
            close()
        self.finished = True

    def _wait_for(self, recorded: float) -> None:
        if not self._pace:
            return
        if self._origin is None:
            self._origin = (recorded, self._monotonic())
            return
        due = self._origin[1] + (recorded - self._origin[0]) / self._speed
        delay = due - self._monotonic()
        if delay > 0:
            self._sleep(delay)
