"""What the FPU probe's counts say about how a process uses the SSE rounding modes.

The probe (probes/fpu.bpf.c) counts, per thread, its looks per mode and per pair of consecutive
looks.  RandomX's CFROUND picks a mode from random register bits, so a miner's looks spread
evenly over all four modes, each independent of the one before; interval arithmetic, set-once
code and test suites switch modes in fixed patterns (docs/rules.md, "The rounding-mode
pattern").  :func:`rounding_pattern` measures both properties with a chi-square test (is the
departure real?) and an effect size (is it large?: Cohen's w, Cramér's V), and asks for shares
that a program as uneven as the most even benign switcher (:data:`BENIGN_DISTANCE`) shows at
most :data:`FALSE_RANDOM` of the time, since over a few dozen looks a suite's shares can come
out even by chance (a noncentral chi-square: a Poisson mixture of central ones, both computed
here).  ``random`` is the RandomX pattern.  :class:`FpuCounts`, one process's totals, is
defined here, below both its readers (sources/ebpf/fpu_probe.py, sources/proc/cpu_usage.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

MIN_LOOKS = 64  # fewer: too few to judge (a throttled miner gets ~3 looks/s on a busy host)
MIN_MODE_SHARE = 0.1  # each of the four modes (RandomX: 0.23-0.30 each)
ALPHA = 0.001  # a departure counts only if a chi-square test gives p below this ...
MAX_UNIFORM_DISTANCE = 0.3  # ... and Cohen's w from even shares exceeds this
MAX_DEPENDENCE = 0.2  # ... and Cramér's V between consecutive looks exceeds this
MIN_TRANSITIONS = 32  # fewer pairs of consecutive looks: independence is not tested
# The most even benign switcher measured is a test suite with long tables (Cohen's w 0.61-0.71
# from even shares; glibc's shape 0.62-0.69, interval arithmetic 0.72): the pattern needs shares
# a program BENIGN_DISTANCE from even shows at most FALSE_RANDOM of the time (docs/rules.md).
BENIGN_DISTANCE = 0.55
FALSE_RANDOM = 0.001
# A thread "never sleeps" by the FPU probe's own looks when at least SLEEPLESS_MIN_LOOKS of its
# switch-outs were seen and at most SLEEPLESS_SHARE of them were because it blocked: a worker
# throttled by a CPU quota or paused by SIGSTOP is switched out runnable or stopped.
SLEEPLESS_MIN_LOOKS = 32
SLEEPLESS_SHARE = 0.05


@dataclass(frozen=True, slots=True)
class FpuCounts:
    """One process's totals over its threads (``struct gg_fpu_rounding``, summed)."""

    modes: tuple[int, ...]  # looks per mode: nearest, down, up, toward zero
    transitions: tuple[int, ...]  # 16: consecutive looks of one thread, previous * 4 + next
    preempted: int  # looks at a switch-out while runnable (preempted, throttled, yielded)
    stopped: int  # ... while stopped from outside (SIGSTOP, ptrace, freezer)
    threads: int  # threads seen leaving round-to-nearest
    span_s: float  # first to latest counted look
    sleepless: int = 0  # of those threads, ones never found asleep (see SLEEPLESS_*)

    @property
    def samples(self) -> int:
        return sum(self.modes)

    @property
    def nondefault(self) -> int:
        return self.samples - self.modes[0]

    @property
    def changes(self) -> int:
        """Looks unlike the previous look of the same thread; each thread's first look counts
        as one (it left the round-to-nearest every thread starts in)."""
        same = sum(self.transitions[i * 5] for i in range(4))
        return sum(self.transitions) - same + self.threads

    @property
    def sleeps(self) -> int:
        """Looks at a switch-out because the thread blocked (slept, waited)."""
        return self.samples - self.preempted - self.stopped


def chi2_sf(x: float, df: int) -> float:
    """P(X >= x) for a chi-square variable with ``df`` (a positive integer) degrees of freedom.

    Even df: e^(-x/2) * sum (x/2)^i / i! for i < df/2.  Odd df: erfc(sqrt(x/2)) plus
    e^(-x/2) * sum (x/2)^(i - 1/2) / Gamma(i + 1/2) for i = 1 .. (df-1)/2."""
    if df < 1:
        raise ValueError("degrees of freedom must be a positive integer")
    if x <= 0:
        return 1.0
    half = x / 2.0
    if df % 2 == 0:
        term = total = 1.0
        for i in range(1, df // 2):
            term *= half / i
            total += term
        return min(1.0, math.exp(-half) * total)
    total = math.erfc(math.sqrt(half))
    term = math.sqrt(half) / math.gamma(1.5)  # i = 1
    for i in range(1, (df - 1) // 2 + 1):
        if i > 1:
            term *= half / (i - 0.5)
        total += math.exp(-half) * term
    return min(1.0, total)


def ncx2_cdf(x: float, df: int, noncentrality: float) -> float:
    """P(X <= x) for a noncentral chi-square variable: the central ones with df, df + 2, ...
    degrees of freedom weighed by a Poisson(noncentrality / 2) draw, each central one from the
    one before (F(df + 2) = F(df) - (x/2)^(df/2) e^(-x/2) / Gamma(df/2 + 1)); stops once the
    weights past the mean or the central terms are negligible."""
    if x <= 0:
        return 0.0
    half, mean = x / 2.0, noncentrality / 2.0
    central = 1.0 - chi2_sf(x, df)
    if mean <= 0:
        return central
    log_weight, total, j, k = -mean, 0.0, 0, df
    while True:
        weight = math.exp(log_weight)
        total += weight * central
        if central < 1e-17 or (j > mean and weight < 1e-17):
            break
        central -= math.exp(k / 2.0 * math.log(half) - half - math.lgamma(k / 2.0 + 1.0))
        central = max(central, 0.0)
        j, k = j + 1, k + 2
        log_weight += math.log(mean / j)
    return min(1.0, total)


def uniform_test(counts: Sequence[int]) -> tuple[float, float]:
    """(p-value, Cohen's w) of ``counts`` against an even spread over all of them."""
    n = sum(counts)
    if n == 0:
        return 1.0, 0.0
    expected = n / len(counts)
    x2 = sum((c - expected) ** 2 for c in counts) / expected
    return chi2_sf(x2, len(counts) - 1), math.sqrt(x2 / n)


def independence_test(table: Sequence[int], size: int = 4) -> tuple[float, float] | None:
    """(p-value, Cramér's V) of a ``size`` x ``size`` table (row-major: previous look, next
    look) against independence; None when fewer than two rows or columns were seen."""
    rows = [sum(table[r * size : (r + 1) * size]) for r in range(size)]
    cols = [sum(table[c::size]) for c in range(size)]
    n = sum(rows)
    live_rows = [r for r in range(size) if rows[r]]
    live_cols = [c for c in range(size) if cols[c]]
    if n == 0 or len(live_rows) < 2 or len(live_cols) < 2:
        return None
    x2 = 0.0
    for r in live_rows:
        for c in live_cols:
            expected = rows[r] * cols[c] / n
            x2 += (table[r * size + c] - expected) ** 2 / expected
    df = (len(live_rows) - 1) * (len(live_cols) - 1)
    return chi2_sf(x2, df), math.sqrt(x2 / (n * (min(len(live_rows), len(live_cols)) - 1)))


@dataclass(frozen=True, slots=True)
class RoundingPattern:
    """How one process's looks spread over the modes (``random``: the RandomX pattern)."""

    looks: int
    modes_seen: int  # modes with at least one look
    min_share: float  # the least-seen mode's share of the looks (0-0.25)
    uniform_p: float  # chi-square p-value of the per-mode counts against even shares
    uniform_distance: float  # Cohen's w from even shares (0: even)
    transitions: int  # pairs of consecutive looks of one thread
    independent_p: float | None  # chi-square p-value of consecutive looks being independent
    dependence: float | None  # Cramér's V between consecutive looks (0: independent)
    # how often a program BENIGN_DISTANCE from even would show shares this even over this many
    # looks; None where the shares or the order already rule RandomX out
    benign_p: float | None
    random: bool

    @property
    def undecided(self) -> bool:
        """RandomX's shape so far, over too few looks to tell it from a benign switcher."""
        return self.benign_p is not None and not self.random


def rounding_pattern(modes: Sequence[int], transitions: Sequence[int]) -> RoundingPattern | None:
    """The pattern of ``modes`` (looks per mode in ``events.abi.FpuMode`` order: nearest, down,
    up, toward zero) and ``transitions`` (16 counts, previous mode * 4 + next mode); None below
    :data:`MIN_LOOKS` looks."""
    looks = sum(modes)
    if len(modes) != 4 or looks < MIN_LOOKS:
        return None
    uniform_p, distance = uniform_test(modes)
    pairs = sum(transitions) if len(transitions) == 16 else 0
    tested = independence_test(transitions) if pairs >= MIN_TRANSITIONS else None
    independent_p, dependence = tested if tested is not None else (None, None)
    min_share = min(modes) / looks
    shaped = (
        min_share >= MIN_MODE_SHARE
        and not (uniform_p < ALPHA and distance > MAX_UNIFORM_DISTANCE)
        and not (
            independent_p is not None and independent_p < ALPHA and dependence > MAX_DEPENDENCE
        )
    )
    benign_p = (
        ncx2_cdf(looks * distance * distance, 3, looks * BENIGN_DISTANCE**2) if shaped else None
    )
    random = benign_p is not None and benign_p <= FALSE_RANDOM
    return RoundingPattern(
        looks=looks,
        modes_seen=sum(1 for c in modes if c),
        min_share=round(min_share, 3),
        uniform_p=round(uniform_p, 6),
        uniform_distance=round(distance, 3),
        transitions=pairs,
        independent_p=round(independent_p, 6) if independent_p is not None else None,
        dependence=round(dependence, 3) if dependence is not None else None,
        benign_p=round(benign_p, 6) if benign_p is not None else None,
        random=random,
    )
