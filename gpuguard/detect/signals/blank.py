"""Blank inputs: what a state has not been given, and the signal values that follow from that alone.

A signal is a function of the inputs it declares (``Signal.reads``, checked by
tests/test_signal_inputs.py).  While every input it reads is as on a state nothing was fed
("blank": no GPU device, no connection, no sample...), its value is its value on such a
state, computed once.  Scoring judges rules with these values to leave out those that
cannot match a process (``RuleSet.groups_for``).
"""

from __future__ import annotations

from collections.abc import Iterable
from operator import attrgetter
from typing import Any

from gpuguard.correlate.state import ProcessKey, ProcessState
from gpuguard.detect.signals.table import SIGNALS

# The key and the clock are always there; the engine supplies the parent's verdict to the reader.
NEVER_BLANK = frozenset({"key", "now", "parent_verdict"})

_BLANK_STATE = ProcessState(ProcessKey(0, 0.0))
_blank_values: dict[str, Any] = {}


def foldable(name: str) -> bool:
    """Whether signal ``name`` has a known value while its inputs are blank (no parameter, and
    every input one a state can leave blank)."""
    signal = SIGNALS[name]
    return signal.parameter is None and not signal.reads & NEVER_BLANK


def blank_value(name: str) -> Any:
    """The value of signal ``name`` (:func:`foldable`) while every input it reads is blank."""
    try:
        return _blank_values[name]
    except KeyError:
        value = _blank_values[name] = SIGNALS[name].compute(_BLANK_STATE, 0.0)
        return value


def inputs_of(signals: Iterable[str]) -> tuple[str, ...]:
    """The inputs the foldable ones of ``signals`` read, sorted: what a probe for them looks at."""
    return tuple(
        sorted({read for name in signals if foldable(name) for read in SIGNALS[name].reads})
    )


def values_while_blank(signals: Iterable[str], blank: set[str]) -> dict[str, Any]:
    """The value of each of ``signals`` that reads only inputs in ``blank``."""
    return {
        name: blank_value(name)
        for name in signals
        if foldable(name) and SIGNALS[name].reads <= blank
    }


class BlankProbe:
    """Which of some inputs are blank on a state: ``probe(state)`` is a tuple of booleans, one per
    name in ``probe.inputs``, usable as a dictionary key.

    A plain value is blank when it equals the blank state's and has its type (an empty set, 0,
    None); a sample window or GPU behaviour when nothing was ever added to it.
    """

    __slots__ = ("inputs", "_values", "_expected")

    def __init__(self, inputs: tuple[str, ...]) -> None:
        self.inputs = inputs
        paths, expected = [], []
        for name in inputs:
            assert name not in NEVER_BLANK, name
            blank = attrgetter(name)(_BLANK_STATE)
            if hasattr(blank, "untouched"):
                paths.append(f"{name}.untouched")
                expected.append((True, bool))
            else:
                assert blank is None or type(blank) in (int, str, set, frozenset, dict, list), name
                paths.append(name)
                expected.append((blank, type(blank)))
        getter = attrgetter(*paths) if paths else (lambda state: ())
        # attrgetter of one name returns the value itself, not a tuple of one
        self._values = getter if len(paths) != 1 else (lambda state: (getter(state),))
        self._expected = tuple(expected)

    def __call__(self, state: ProcessState) -> tuple[bool, ...]:
        return tuple(
            [
                type(value) is kind and value == blank
                for value, (blank, kind) in zip(self._values(state), self._expected, strict=True)
            ]
        )
