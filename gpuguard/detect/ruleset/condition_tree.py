"""A compiled condition's tree: its leaves (one signal test each) and junctions (all, any, not).

Details: docs/internals.md, "conditions".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuguard.detect.signals.reader import SignalReader
from gpuguard.detect.signals.table import SIGNALS

Condition = Callable[[SignalReader], "list[str] | None"]


@dataclass(frozen=True, slots=True)
class Leaf:
    """One compiled test of one signal, kept beside the condition tree it is part of.

    The rescore policy reads these: which values a rule compares a clock signal with
    (``age_s``), and which tests of GPU-window signals can change a rule's outcome.
    """

    signal: str
    op: str
    operand: Any
    test: Condition


@dataclass(frozen=True, slots=True)
class Junction:
    """``all``, ``any`` or ``not`` of compiled parts: with the leaves, a condition's tree, which
    :func:`known_outcome` judges from some signals' values alone."""

    kind: str
    parts: tuple[Leaf | Junction, ...]


Shape = Leaf | Junction


def known_outcome(shape: Shape, known: dict[str, Any]) -> bool | None:
    """Whether the condition of ``shape`` matches when the signals named in ``known`` have those
    values: True or False, or None when that depends on a signal not in ``known``."""
    if type(shape) is Leaf:
        if shape.signal not in known or SIGNALS[shape.signal].parameter is not None:
            return None
        return shape.test(known) is not None
    answers = [known_outcome(part, known) for part in shape.parts]
    if shape.kind == "not":
        return None if answers[0] is None else not answers[0]
    decisive = shape.kind == "any"  # any: one True decides; all: one False decides
    if decisive in answers:
        return decisive
    return None if None in answers else not decisive
