"""Detect's memo: entries go stale when the state's inputs move, and tests can set them aside."""

from __future__ import annotations

import gc

from gpuguard.correlate.state import ProcessKey, ProcessState
from gpuguard.detect.signals import memo
from tests.support.memo import set_aside


def _state(pid: int = 7) -> ProcessState:
    return ProcessState(ProcessKey(pid, 100.0), first_seen=100.0, last_seen=100.0)


def test_an_entry_is_kept_until_a_generation_it_depends_on_moves():
    state = _state()
    entries = memo.entries_of(state)
    memo.keep(entries, state, "rules:network", "outcome")
    memo.keep(entries, state, "rules:facts", "facts outcome")
    state.devices_gen += 1  # neither reads devices
    assert memo.kept(memo.entries_of(state), state, "rules:network") == "outcome"
    state.add_connection("192.0.2.1", 3333)  # a new endpoint moves network_gen
    assert memo.kept(memo.entries_of(state), state, "rules:network") is None
    assert memo.kept(memo.entries_of(state), state, "rules:facts") == "facts outcome"
    state.facts_gen += 1  # new facts: everything is stale
    assert memo.kept(memo.entries_of(state), state, "rules:facts") is None


def test_set_aside_gives_an_empty_memo_and_puts_the_entries_back():
    state = _state()
    memo.keep(memo.entries_of(state), state, "cmdline", "parsed")
    with set_aside(state):
        inside = memo.entries_of(state)  # also right after the state was the last one asked for
        assert memo.kept(inside, state, "cmdline") is None
        memo.keep(inside, state, "cmdline", "fresh")
    assert memo.kept(memo.entries_of(state), state, "cmdline") == "parsed"
    memo.forget(state)
    assert memo.entries_of(state) == {}


def test_entries_go_with_their_state():
    other = _state(8)
    memo.keep(memo.entries_of(other), other, "config", "parsed")
    memo.entries_of(_state(9))  # the last one asked for is another state now
    gc.collect()  # earlier tests' states in reference cycles go now, not inside the count
    before = len(memo._MEMO)
    del other
    gc.collect()
    assert len(memo._MEMO) == before - 1
