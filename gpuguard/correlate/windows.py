"""Bounded sliding windows: time series of samples and event-count rates.

Both keep at most ``max_samples`` entries and forget anything older than
``span_s`` before the newest entry, so a process that lives for weeks costs
the same memory as one that lives for minutes.  A window allocates its storage
on its first entry: most processes never get a GPU or CPU sample, and an empty
deque costs ~600 bytes (six windows per process; benchmarks/bench_correlate_memory.py).
"""

from __future__ import annotations

import math
from collections import deque


class SampleWindow:
    """Samples ``(time, value)`` over the last ``span_s`` seconds: mean, variance, span."""

    __slots__ = ("span_s", "max_samples", "_samples", "_shift", "_sum", "_sumsq", "_low", "_added")

    def __init__(
        self, span_s: float = 300.0, max_samples: int = 600, track_minimum: bool = False
    ) -> None:
        self.span_s = span_s
        self.max_samples = max_samples
        # An empty tuple until the first sample (reads work on both); then a bounded deque.
        self._samples: deque[tuple[float, float]] | tuple[()] = ()
        # Running sums of (value - shift): the shift is a recent mean, so a flat signal (SM 99 %,
        # memory controller 0 %) sums to ~0 and its variance needs no pass over the window.
        self._shift = 0.0
        self._sum = 0.0
        self._sumsq = 0.0
        # With track_minimum: the samples that can still become the minimum, values increasing
        # (a monotonic queue), so ``minimum`` costs O(1) instead of a pass over the window.
        # (index, value); like _samples, an empty tuple until the first sample.
        self._low: deque[tuple[int, float]] | tuple[()] | None = () if track_minimum else None
        self._added = 0  # samples ever added: the index of the next one

    def add(self, time: float, value: float) -> None:
        samples = self._samples
        if isinstance(samples, tuple):
            samples = self._samples = deque(maxlen=self.max_samples)
        if not samples:
            self._shift, self._sum, self._sumsq = value, 0.0, 0.0
        if len(samples) == samples.maxlen:
            self._forget(samples[0][1])
        samples.append((time, value))
        d = value - self._shift
        self._sum += d
        self._sumsq += d * d
        horizon = time - self.span_s
        while samples and samples[0][0] < horizon:
            self._forget(samples.popleft()[1])
        low = self._low
        if low is not None:
            if isinstance(low, tuple):
                low = self._low = deque()
            while low and low[-1][1] >= value:
                low.pop()
            low.append((self._added, value))
            first_kept = self._added + 1 - len(samples)
            while low[0][0] < first_kept:
                low.popleft()
        self._added += 1

    def _forget(self, value: float) -> None:
        d = value - self._shift
        self._sum -= d
        self._sumsq -= d * d

    def _recenter(self) -> None:
        """Shift the running sums to the current mean, summed afresh (one pass, rarely)."""
        n = len(self._samples)
        self._shift += self._sum / n
        shift = self._shift
        self._sum = sum(v - shift for _, v in self._samples)
        self._sumsq = sum((v - shift) ** 2 for _, v in self._samples)

    def __len__(self) -> int:
        return len(self._samples)

    @property
    def untouched(self) -> bool:
        """Nothing was ever added (an emptied window is not untouched)."""
        return self._added == 0

    @property
    def latest(self) -> float | None:
        return self._samples[-1][1] if self._samples else None

    @property
    def duration_s(self) -> float:
        """Time between the oldest and the newest sample in the window."""
        if len(self._samples) < 2:
            return 0.0
        return self._samples[-1][0] - self._samples[0][0]

    @property
    def mean(self) -> float | None:
        n = len(self._samples)
        return self._shift + self._sum / n if n else None

    @property
    def variance(self) -> float | None:
        """Population variance of the values (None with fewer than two samples)."""
        n = len(self._samples)
        if n < 2:
            return None
        offset = self._sum / n  # the mean's distance from the shift
        value = self._sumsq / n - offset * offset
        # The subtraction loses digits when the mean has moved far from the shift while the
        # spread is small (a signal that jumped, then stayed flat): shift to the mean and sum
        # again.  Near the shift it is exact enough, so a flat window never walks its samples.
        if offset * offset > 1.0 and value < 1e-6 * offset * offset:
            self._recenter()
            offset = self._sum / n
            value = self._sumsq / n - offset * offset
        return max(0.0, value)

    @property
    def minimum(self) -> float | None:
        if not self._samples:
            return None
        if self._low:
            return self._low[0][1]
        return min(v for _, v in self._samples)

    def values(self) -> list[float]:
        return [v for _, v in self._samples]


class RateWindow:
    """Counts reported at times; the rate per second over the last ``span_s`` seconds.

    Counts are kept in one-second buckets, so the many reports a busy process
    makes within a second cost one addition each.
    """

    __slots__ = ("span_s", "_seconds", "_counts", "_total", "first_time")

    def __init__(self, span_s: float = 60.0, max_buckets: int = 256) -> None:
        self.span_s = span_s
        # Two deques of plain ints (not per-bucket objects): nothing for the garbage collector to chase.
        self._seconds: deque[int] = deque(maxlen=max_buckets)
        self._counts: deque[int] = deque(maxlen=max_buckets)
        self._total = 0
        self.first_time: float | None = None

    def add(self, time: float, count: int) -> None:
        second = int(time)
        seconds = self._seconds
        self._total += count
        if seconds and seconds[-1] == second:
            self._counts[-1] += count
            return
        if self.first_time is None:
            self.first_time = time
        counts = self._counts
        if len(seconds) == seconds.maxlen:
            self._total -= counts[0]
        seconds.append(second)
        counts.append(count)
        horizon = second - self.span_s
        while seconds[0] <= horizon:
            seconds.popleft()
            self._total -= counts.popleft()

    def rate(self, now: float) -> float:
        """Events per second in the last ``span_s`` seconds before ``now``; divided by the time
        observed (at least 1 s)."""
        if self.first_time is None:
            return 0.0
        horizon = int(now) - self.span_s
        total = self._total
        for second, count in zip(self._seconds, self._counts, strict=False):
            if second > horizon:
                break
            total -= count
        observed = min(self.span_s, max(1.0, now - self.first_time))
        return total / observed if math.isfinite(observed) else 0.0
