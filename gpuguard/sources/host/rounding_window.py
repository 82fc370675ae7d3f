"""Scan's look at the SSE rounding modes of its CPU candidates: the FPU probe for a short window.

Scan loads the probe (probes/fpu.bpf.c) only when its /proc walk found a candidate: a thread
that never sleeps by its lifetime schedstat totals, or one paused from outside
(``cpu_usage.paused_threads``); a host without one pays nothing.  The window (``--cpu-window``,
3 s) is extended, to at most :data:`EXTEND_FACTOR` times its length, while a candidate seen
leaving round-to-nearest has fewer looks than the pattern needs (``MIN_LOOKS``), or shows
RandomX's shape over too few looks to tell it from a benign switcher (``undecided``): a lone
thread throttled on a quiet host is switched out only a few times a second.  Each candidate's
``CpuActivity`` gets the probe's totals, as the agent's does.  Where the probe cannot load
(no BTF, no tracepoint, no bcc, not root) one line says why and nothing else changes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gpuguard.events.model import CpuActivity
from gpuguard.events.rounding_modes import MIN_LOOKS, FpuCounts, rounding_pattern
from gpuguard.sources.ebpf.fpu_probe import FpuProbe
from gpuguard.sources.proc.cpu_usage import cpu_activity_with_fpu

EXTEND_FACTOR = 3.0
POLL_S = 0.25


@dataclass(slots=True)
class RoundingWindow:
    """What the window saw: the candidates' activity with the probe's totals (empty when blind)."""

    activity: dict[int, CpuActivity] = field(default_factory=dict)
    observed_s: float = 0.0  # seconds the probe was attached
    load_s: float = 0.0  # seconds compiling and attaching it
    blind_spot: str = ""  # why the probe could not load ("" when it did)
    short: int = 0  # candidates left short of looks (or undecided) when the window ended
    extended: bool = False  # the window ran past its length for them


def _short(seen: FpuCounts) -> bool:
    """Too few looks to judge, or RandomX's shape over too few to tell it apart yet."""
    if seen.samples < MIN_LOOKS:
        return True
    pattern = rounding_pattern(seen.modes, seen.transitions)
    return pattern is not None and pattern.undecided


def watch_rounding(
    candidates: dict[int, CpuActivity],
    window_s: float,
    open_probe: Callable[[], FpuProbe] = FpuProbe.open,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> RoundingWindow:
    """Attach the probe, watch ``candidates`` ({pid: its lifetime CpuActivity}) for ``window_s``
    (longer while one is short of looks), and return their activity with the totals."""
    out = RoundingWindow()
    if not candidates or window_s <= 0:
        return out
    probe = open_probe()
    if not probe.loaded:
        out.blind_spot = probe.blind_spot
        return out
    out.load_s = probe.load_seconds
    started = clock()
    try:
        sleep(window_s)
        while True:
            counts = probe.counts()
            short = [pid for pid in candidates if pid in counts and _short(counts[pid])]
            elapsed = clock() - started
            if not short or elapsed >= window_s * EXTEND_FACTOR:
                break
            out.extended = True
            sleep(min(POLL_S, window_s * EXTEND_FACTOR - elapsed))
    finally:
        out.observed_s = clock() - started
        probe.close()
    out.short = len(short)
    for pid, activity in candidates.items():
        out.activity[pid] = cpu_activity_with_fpu(activity, counts.get(pid))
    return out
