"""What a rule signal is (name, type, description, the inputs it reads) and the mark defining one."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

SIGNAL_TYPES = ("bool", "number", "text", "texts", "numbers")


@dataclass(frozen=True, slots=True)
class Signal:
    name: str
    type: str
    group: str
    description: str
    compute: Callable[..., Any]  # (state, now), or (state, now, argument) with a parameter
    parameter: str | None = None  # a condition key naming what to measure, e.g. ``command``
    # What it reads: ProcessState fields (``network.<field>`` for the NetworkView's) and "now"
    # (the clock); gpuguard.detect.signals.rescore derives caching and rescoring from these, and
    # tests/test_signal_inputs.py fails on a read that is not declared.
    reads: frozenset[str] = frozenset()
    period_s: float | None = None  # reads "now": how often the engine looks at it again


def signal(
    name: str,
    type_: str,
    group: str,
    description: str,
    parameter: str | None = None,
    *,
    reads: tuple[str, ...],
    period_s: float | None = None,
):
    """Mark a function as the rule signal ``name`` reading ``reads``; it counts once listed in
    detect.signals.table."""

    def mark(fn: Callable[..., Any]) -> Callable[..., Any]:
        assert type_ in SIGNAL_TYPES
        assert ("now" in reads) == (period_s is not None), f"{name}: the clock needs a period"
        fn.signal = Signal(
            name, type_, group, description, fn, parameter, frozenset(reads), period_s
        )
        return fn

    return mark
