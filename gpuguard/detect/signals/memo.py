"""Detect's memo: what it derived from a process's state, kept until the state's inputs move.

Parsed command lines, signal values, rule outcomes and the engine's last GPU answers are
kept here, not on the state: correlation owns the state and only moves its generation
counters (``facts_gen``, ``network_gen``, ``devices_gen``) when an input changes.  Each
entry carries the generations it was derived at and is stale once one of them moved.  The
memo holds its states weakly, so an entry goes with its process.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any
from weakref import WeakKeyDictionary

from gpuguard.correlate.state import ProcessState

_FACTS = attrgetter("facts_gen")
_NETWORK = attrgetter("facts_gen", "network_gen")
_DEVICES = attrgetter("facts_gen", "devices_gen")
_ALL = attrgetter("facts_gen", "network_gen", "devices_gen")

# Every entry name, with the generations an entry's value depends on.
STAMPS = {
    "cmdline": _FACTS,  # the parsed command line (signals.parsed)
    "config": _FACTS,  # the parsed config files (signals.parsed)
    "gpu-answers": _FACTS,  # (rule set, time, answers of its GPU tests) at the engine's last look
    "signals:facts": _FACTS,  # signal values (signals.reader, rescore.SIGNAL_CACHE)
    "signals:network": _NETWORK,
    "signals:devices": _DEVICES,
    "rules:facts": _FACTS,  # rule outcomes (scoring.score, rescore.rule_cache)
    "rules:network": _NETWORK,
    "rules:devices": _DEVICES,
    "rules:devices+network": _ALL,
}

_MEMO: WeakKeyDictionary[ProcessState, dict[str, tuple[Any, Any]]] = WeakKeyDictionary()


# The state asked for last and its entries: one evaluation asks for the same state several
# times (the reader, the parsed command line, the config files).  One tuple, replaced whole, so
# a reader in another thread sees a matching pair.
_last: tuple[ProcessState | None, dict] = (None, {})


def entries_of(state: ProcessState) -> dict[str, tuple[Any, Any]]:
    """The state's entries (name -> (generations, value)), for :func:`kept` and :func:`keep`."""
    global _last
    last = _last
    if last[0] is state:
        return last[1]
    entries = _MEMO.get(state)
    if entries is None:
        entries = _MEMO[state] = {}
    _last = (state, entries)
    return entries


def kept(entries: dict, state: ProcessState, name: str) -> Any:
    """The value kept under ``name`` while still current for ``state``, else None."""
    entry = entries.get(name)
    if entry is not None and entry[0] == STAMPS[name](state):
        return entry[1]
    return None


def keep(entries: dict, state: ProcessState, name: str, value: Any) -> Any:
    """Keep ``value`` (not None) under ``name``, stamped with ``state``'s generations now."""
    entries[name] = (STAMPS[name](state), value)
    return value


def forget(state: ProcessState) -> None:
    """Drop everything kept for ``state`` (the next evaluation derives it all again)."""
    global _last
    _last = (None, {})
    _MEMO.pop(state, None)
