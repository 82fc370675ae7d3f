"""Reading signals for one evaluation: each computed at most once, kept values reused.

:class:`SignalReader` is what rule conditions index: ``reader[name]``
computes signal ``name`` (listed in :mod:`gpuguard.detect.signals.table`) the first time
and caches it for the rest of the evaluation; values derived from the facts,
endpoints or devices are also kept in detect's memo (:mod:`gpuguard.detect.signals.memo`,
see :mod:`gpuguard.detect.signals.rescore`) until those change.
"""

from __future__ import annotations

from typing import Any

from gpuguard.correlate.state import ProcessState
from gpuguard.detect.signals.memo import entries_of, keep, kept
from gpuguard.detect.signals.rescore import KEPT_SIGNAL_CACHES, SIGNAL_CACHE
from gpuguard.detect.signals.table import SIGNALS

# signal name -> (its compute function, the memo entry its value is kept in or None): one lookup
_PLAN = {name: (signal.compute, SIGNAL_CACHE[name]) for name, signal in SIGNALS.items()}


class SignalReader(dict):
    """Signals of one process at one moment, each computed at most once.

    A dict whose missing keys are computed on first use: ``reader[name]`` (or
    ``reader.get(name)``) costs one dictionary lookup after the first time.
    It starts with the values kept in the memo from earlier evaluations.
    """

    __slots__ = ("state", "now", "memo", "caches")

    def __init__(self, state: ProcessState, now: float) -> None:
        super().__init__()
        self.state = state
        self.now = now
        self.memo = entries = entries_of(state)
        # the memo's value dicts found current for this evaluation, by cache name: each is
        # checked against the state's generations once per evaluation, not once per signal
        self.caches = caches = {}
        if entries:
            for cache_name in KEPT_SIGNAL_CACHES:
                values = kept(entries, state, cache_name)
                if values is not None:
                    caches[cache_name] = values
                    if values:
                        self.update(values)

    def __missing__(self, name: str | tuple[str, str]) -> Any:
        if type(name) is tuple:  # (signal, argument) for a signal with a parameter; never kept
            signal_name, argument = name
            value = self[name] = SIGNALS[signal_name].compute(self.state, self.now, argument)
            return value
        compute, cache_name = _PLAN[name]
        if cache_name is None:
            value = self[name] = compute(self.state, self.now)
            return value
        # Values derived from the facts, endpoints or devices are kept in the memo until
        # those change (the state's generations move then; see rescore.signal_kind).
        cache = self.caches.get(cache_name)
        if cache is None:
            cache = kept(self.memo, self.state, cache_name)
            if cache is None:
                cache = keep(self.memo, self.state, cache_name, {})
            self.caches[cache_name] = cache
        try:
            value = cache[name]
        except KeyError:
            value = cache[name] = compute(self.state, self.now)
        self[name] = value
        return value

    def get(self, name: str) -> Any:  # type: ignore[override]
        return self[name]
