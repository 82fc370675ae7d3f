"""Every rule signal reads exactly the inputs it declares (``Signal.reads``).

Caching and rescoring (gpuguard.detect.signals.rescore) are derived from the declarations, so a
signal reading an undeclared input would be cached too long or not rescored.  Each signal is
run against a proxy of the state that records the fields it touches, on the states the golden
cases replay to plus a few built here, at two times far apart (a value that moves with the
clock must declare "now").
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuguard.correlate.state import ProcessState
from gpuguard.detect.cases import CAPTURE, replay
from gpuguard.detect.ruleset.load import load_ruleset
from gpuguard.detect.ruleset.shipped import shipped_rules_file
from gpuguard.detect.signals.definition import Signal
from gpuguard.detect.signals.rescore import INPUTS
from gpuguard.detect.signals.table import SIGNALS
from tests.support.signal_states import built_states

CASES = Path(__file__).parent / "cases"
T = 1_700_002_800.0


class StateRecorder:
    """A ProcessState that records which fields are read (``network.<field>`` for the
    NetworkView's, ``facts.<field>`` for the facts': looking whether there are facts is part of
    reading one of their fields).  It is a new object to detect's memo, which holds nothing for
    it, so every derivation reads its inputs; the generations the memo stamps its entries with
    are bookkeeping, not inputs, and are not recorded."""

    def __init__(self, state: ProcessState, seen: set[str], prefix: str = "") -> None:
        object.__setattr__(self, "_state", state)
        object.__setattr__(self, "_seen", seen)
        object.__setattr__(self, "_prefix", prefix)

    def __getattr__(self, name: str):
        value = getattr(self._state, name)
        if not self._prefix and name in ("facts_gen", "network_gen", "devices_gen"):
            return value
        if not self._prefix and name == "network":
            return StateRecorder(value, self._seen, "network.")
        if not self._prefix and name == "facts":
            return None if value is None else StateRecorder(value, self._seen, "facts.")
        self._seen.add(self._prefix + name)
        return value

    def __setattr__(self, name: str, value) -> None:
        raise AssertionError(f"a signal wrote {name} on the state")


def inputs_read(signal: Signal, states: list[ProcessState]) -> set[str]:
    """The inputs ``signal`` read on ``states``; "now" when its value differed 7 hours later."""
    seen: set[str] = set()
    for state in states:
        values = []
        for now in (state.last_seen + 30, state.last_seen + 7 * 3600):
            args = (now, "UVM_REGISTER_CHANNEL") if signal.parameter else (now,)
            values.append(signal.compute(StateRecorder(state, seen), *args))
        if values[0] != values[1]:
            seen.add("now")
    return seen


@pytest.fixture(scope="module")
def states() -> list[ProcessState]:
    ruleset = load_ruleset([shipped_rules_file()])
    found = built_states()
    for case in sorted(CASES.iterdir()):
        if (case / CAPTURE).exists():
            found += list(replay(case / CAPTURE, ruleset)[1].unordered_states())
    return found


def test_every_signal_reads_exactly_what_it_declares(states):
    wrong = {}
    for name, signal in SIGNALS.items():
        read = inputs_read(signal, states)
        if read != signal.reads:
            wrong[name] = {
                "undeclared": sorted(read - signal.reads),
                "never read here": sorted(signal.reads - read),
            }
    assert not wrong, (
        f"signals whose reads differ from their declaration (Signal.reads): {wrong}; a read "
        "never seen needs a state above that takes that branch"
    )


def test_every_declared_input_is_known_to_the_rescore_policy():
    for signal in SIGNALS.values():
        assert signal.reads and signal.reads <= INPUTS.keys(), signal.name


def test_an_undeclared_read_is_caught(states):
    def sneaky(s, now):
        return s.exe if s.comm else None

    signal = Signal("sneaky", "text", "identity", "", sneaky, reads=frozenset({"comm"}))
    assert inputs_read(signal, states) == {"comm", "exe"}

    def clock(s, now):
        return now - s.key.start_time

    signal = Signal("clock", "number", "time", "", clock, reads=frozenset({"key"}))
    assert inputs_read(signal, states) == {"key", "now"}
