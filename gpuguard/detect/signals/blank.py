"""Blank inputs: what a state has not been given, and the signal values that follow from that alone.

A signal is a function of the inputs it declares (``Signal.reads``, checked by
tests/test_signal_inputs.py).  While every input it reads is *blank*, as on a state that got
empty facts and nothing else (no GPU device, connection, sample, YARA match...), its value
is its value on that state, computed once.  Scoring judges rules with these values to leave
out those that cannot match a process (``RuleSet.groups_for``), and gives processes whose
inputs are equal the outcome computed for the first of them (:class:`InputValues`).
"""

from __future__ import annotations

from collections.abc import Iterable
from operator import and_, attrgetter, eq, is_
from typing import Any

from gpuguard.correlate.state import ProcessKey, ProcessState
from gpuguard.detect.signals.table import SIGNALS
from gpuguard.events.process_facts import ProcessFacts

# The key, the clock and the facts as a whole are never blank (a state's facts are absent or
# name their process); the engine supplies the parent's verdict to the reader.
NEVER_BLANK = frozenset({"key", "now", "facts", "parent_verdict"})
_FACTS = "facts."  # a field of the facts: blank when there are facts and it is its default

_BLANK_STATE = ProcessState(ProcessKey(0, 0.0), facts=ProcessFacts(pid=0, start_time=0.0))
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
    None, False); a sample window or GPU behaviour when nothing was ever added to it; a field of
    the facts only when there are facts.
    """

    __slots__ = ("inputs", "_paths", "_values", "_expected", "_blanks", "_kinds")

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
                assert blank is None or type(blank) in _PLAIN, name
                paths.append(name)
                expected.append((blank, type(blank)))
        self._paths = tuple(paths)
        getter = attrgetter(*paths) if paths else (lambda state: ())
        # attrgetter of one name returns the value itself, not a tuple of one
        self._values = getter if len(paths) != 1 else (lambda state: (getter(state),))
        self._expected = tuple(expected)
        self._blanks = tuple(blank for blank, _ in expected)
        self._kinds = tuple(kind for _, kind in expected)

    def __call__(self, state: ProcessState) -> tuple[bool, ...]:
        if state.facts is None:  # none of their fields is blank
            return tuple(
                not path.startswith(_FACTS) and _blank(attrgetter(path)(state), *expected)
                for path, expected in zip(self._paths, self._expected, strict=True)
            )
        values = self._values(state)
        equal = tuple(map(eq, values, self._blanks))
        kinds = tuple(map(type, values))
        if kinds == self._kinds:
            return equal
        return tuple(map(and_, equal, map(is_, kinds, self._kinds)))


_PLAIN = (int, float, bool, str, set, frozenset, dict, list)


def _blank(value: Any, blank: Any, kind: type) -> bool:
    return type(value) is kind and value == blank


class InputValues:
    """The values of some inputs on a state as one hashable key: every signal reading only those
    inputs has the same value on two states with equal keys.  None when a value cannot be a key
    (a list of records, no facts for a ``facts.<field>``)."""

    __slots__ = ("inputs", "_values")

    def __init__(self, inputs: tuple[str, ...]) -> None:
        assert inputs and not set(inputs) & {"key", "now"}, inputs
        self.inputs = inputs
        getter = attrgetter(*inputs)
        self._values = getter if len(inputs) != 1 else (lambda state: (getter(state),))

    def __call__(self, state: ProcessState) -> tuple | None:
        try:
            key = tuple([_frozen(value) for value in self._values(state)])
            hash(key)
        except (TypeError, AttributeError):
            return None
        return key


def _frozen(value: Any) -> Any:
    """``value`` as a dictionary key (a container's elements as they are)."""
    kind = type(value)
    if kind is list:
        return tuple(value)
    if kind is set:
        return frozenset(value)
    if kind is dict:
        return frozenset(value.items())
    return value
