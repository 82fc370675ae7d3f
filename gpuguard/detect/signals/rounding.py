"""Rule signals of the SSE rounding modes a process's threads were switched out in (FPU probe).

From the latest ``CpuActivity`` (the agent's look every housekeeping period, or scan's look
after its CPU window): the probe's totals (probes/fpu.bpf.c) and the pattern in them
(:func:`gpuguard.events.rounding_modes.rounding_pattern`).  The pattern's figures are absent
below ``MIN_LOOKS`` looks: a condition on them never matches on a handful of context switches.
docs/rules.md gives each figure for RandomX, interval arithmetic, set-once code and a test
suite stepping through the modes.
"""

from __future__ import annotations

import functools

from gpuguard.correlate.state import ProcessState
from gpuguard.detect.signals.definition import signal
from gpuguard.events.rounding_modes import (
    BENIGN_DISTANCE,
    FALSE_RANDOM,
    MIN_LOOKS,
    RoundingPattern,
    rounding_pattern,
)


@functools.lru_cache(maxsize=256)
def _pattern_of(modes: tuple[int, ...], transitions: tuple[int, ...]) -> RoundingPattern | None:
    return rounding_pattern(modes, transitions)


def _pattern(s: ProcessState) -> RoundingPattern | None:
    a = s.cpu_activity
    if a is None or not a.fpu_modes:
        return None
    return _pattern_of(tuple(a.fpu_modes), tuple(a.fpu_transitions))


@signal(
    "fpu_watched",
    "bool",
    "cpu",
    "the FPU rounding-mode probe was running for it (false: a blind spot, named in the status file)",
    reads=("cpu_activity",),
)
def fpu_watched(s: ProcessState, now: float) -> bool | None:
    a = s.cpu_activity
    return a.fpu_samples is not None if a is not None else None


@signal(
    "fpu_rounding_changes",
    "number",
    "cpu",
    "context switches (at most one per ms per thread) that found its SSE rounding mode changed "
    "since the thread's previous one; ordinary programs: 0",
    reads=("cpu_activity",),
)
def fpu_rounding_changes(s: ProcessState, now: float) -> int | None:
    a = s.cpu_activity
    return a.fpu_round_changes if a is not None else None


@signal(
    "fpu_rounding_nondefault",
    "number",
    "cpu",
    "context switches (at most one per ms per thread) that found a rounding mode other than nearest",
    reads=("cpu_activity",),
)
def fpu_rounding_nondefault(s: ProcessState, now: float) -> int | None:
    a = s.cpu_activity
    return a.fpu_round_nondefault if a is not None else None


@signal(
    "fpu_rounding_s",
    "number",
    "cpu",
    "seconds from the first to the latest look at a thread that left round-to-nearest",
    reads=("cpu_activity",),
)
def fpu_rounding_s(s: ProcessState, now: float) -> float | None:
    a = s.cpu_activity
    return a.fpu_span_s if a is not None and a.fpu_round_nondefault else None


@signal(
    "fpu_rounding_looks",
    "number",
    "cpu",
    "context switches looked at, of its threads that left round-to-nearest",
    reads=("cpu_activity",),
)
def fpu_rounding_looks(s: ProcessState, now: float) -> int | None:
    a = s.cpu_activity
    return a.fpu_samples if a is not None else None


@signal(
    "fpu_rounding_modes",
    "number",
    "cpu",
    "rounding modes seen (1-4; RandomX: 4; interval arithmetic: 3, never toward zero; "
    "set-once code: 2)",
    reads=("cpu_activity",),
)
def fpu_rounding_modes(s: ProcessState, now: float) -> int | None:
    a = s.cpu_activity
    if a is None or not a.fpu_modes:
        return None
    return sum(1 for count in a.fpu_modes if count)


@signal(
    "fpu_rounding_min_share",
    "number",
    "cpu",
    f"share of its looks in its least-seen rounding mode, of four (RandomX ~0.23-0.25; absent "
    f"below {MIN_LOOKS} looks)",
    reads=("cpu_activity",),
)
def fpu_rounding_min_share(s: ProcessState, now: float) -> float | None:
    p = _pattern(s)
    return p.min_share if p is not None else None


@signal(
    "fpu_rounding_uniform_p",
    "number",
    "cpu",
    "chi-square p-value of its looks per rounding mode against even shares over the four "
    f"(absent below {MIN_LOOKS} looks)",
    reads=("cpu_activity",),
)
def fpu_rounding_uniform_p(s: ProcessState, now: float) -> float | None:
    p = _pattern(s)
    return p.uniform_p if p is not None else None


@signal(
    "fpu_rounding_uniform_distance",
    "number",
    "cpu",
    "how far its looks per mode are from even shares (Cohen's w: 0 even, RandomX ~0.1, "
    f"interval arithmetic ~0.7, one mode held ~1; absent below {MIN_LOOKS} looks)",
    reads=("cpu_activity",),
)
def fpu_rounding_uniform_distance(s: ProcessState, now: float) -> float | None:
    p = _pattern(s)
    return p.uniform_distance if p is not None else None


@signal(
    "fpu_rounding_independent_p",
    "number",
    "cpu",
    "chi-square p-value of a thread's consecutive looks being independent (absent below "
    f"{MIN_LOOKS} looks or with fewer than two modes)",
    reads=("cpu_activity",),
)
def fpu_rounding_independent_p(s: ProcessState, now: float) -> float | None:
    p = _pattern(s)
    return p.independent_p if p is not None else None


@signal(
    "fpu_rounding_dependence",
    "number",
    "cpu",
    "how much a thread's look tells of its next (Cramér's V: 0 independent as RandomX, 1 a "
    "fixed cycle; runs of one mode or a stepping order show 0.3-1)",
    reads=("cpu_activity",),
)
def fpu_rounding_dependence(s: ProcessState, now: float) -> float | None:
    p = _pattern(s)
    return p.dependence if p is not None else None


@signal(
    "fpu_rounding_benign_p",
    "number",
    "cpu",
    "how often a program whose modes are as uneven as the most even benign switcher measured "
    f"(Cohen's w {BENIGN_DISTANCE}) shows shares this even over this many looks; RandomX's "
    f"pattern needs at most {FALSE_RANDOM} (absent below {MIN_LOOKS} looks, or where the "
    "shares or their order already rule RandomX out)",
    reads=("cpu_activity",),
)
def fpu_rounding_benign_p(s: ProcessState, now: float) -> float | None:
    p = _pattern(s)
    return p.benign_p if p is not None else None


@signal(
    "fpu_rounding_random",
    "bool",
    "cpu",
    "RandomX's pattern: all four rounding modes in even shares (each >= 10 %), each look "
    "independent of the thread's previous one, over at least "
    f"{MIN_LOOKS} looks and enough of them to tell the shares from a test suite's "
    '(fpu_rounding_benign_p; docs/rules.md, "The rounding-mode pattern")',
    reads=("cpu_activity",),
)
def fpu_rounding_random(s: ProcessState, now: float) -> bool | None:
    p = _pattern(s)
    return p.random if p is not None else None


@signal(
    "fpu_rounding_sleepless_threads",
    "number",
    "cpu",
    "threads that left round-to-nearest and were never found asleep over 32 or more looks: "
    "switched out only because they were preempted, throttled by a CPU quota or stopped from "
    "outside (a worker that never sleeps, even under a SIGSTOP/SIGCONT duty cycle)",
    reads=("cpu_activity",),
)
def fpu_rounding_sleepless_threads(s: ProcessState, now: float) -> int | None:
    a = s.cpu_activity
    return a.fpu_sleepless_threads if a is not None and a.fpu_samples is not None else None
