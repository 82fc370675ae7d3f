"""The detection engine: scores the correlator's processes with a rule set, parents first.

Wiring (``scan``, golden cases, and the agent to come)::

    correlator = Correlator(facts_provider=...)
    engine = DetectionEngine(correlator, ruleset, yara_scanner=scanner)
    correlator.feed(item) ...           # any number of items
    verdicts = engine.score(now)        # the processes that changed
    engine.set_ruleset(new_ruleset)     # hot reload: everything is rescored next time

The engine tells the correlator which changes matter to its rules (a
:class:`~gpuguard.correlate.correlator.RescorePolicy`) and enriches new facts
(YARA scan of the executable, command line and environment; the executable's
sha256 when an allowlist entry pins one) through the correlator's
``on_new_facts`` hook.  :meth:`DetectionEngine.score` rescores only processes
whose state changed (the ``dirty`` flag), parents before children, so a child
can inherit its parent's verdict; a changed parent verdict rescores its children.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuguard.correlate.correlator import Correlator, RescorePolicy
from gpuguard.correlate.state import ProcessKey, ProcessState
from gpuguard.detect.rules import RuleSet
from gpuguard.detect.score import Verdict, score_process
from gpuguard.events.process_facts import ProcessFacts

if TYPE_CHECKING:
    from gpuguard.detect.yara_scan import YaraScanner

_MAX_PARENT_PASSES = 10   # a chain of changed parents deeper than this waits for the next score


def rescore_policy(ruleset: RuleSet | None) -> RescorePolicy:
    """What the correlator must treat as a change worth rescoring for ``ruleset`` (None: everything)."""
    if ruleset is None:
        return RescorePolicy()
    return RescorePolicy(additions=ruleset.rescore_on, counts=ruleset.reads_counts, rates=ruleset.reads_rates)


class DetectionEngine:
    """Rules applied to a correlator's processes; see the module docstring."""

    def __init__(self, correlator: Correlator, ruleset: RuleSet | None, *,
                 yara_scanner: "YaraScanner | None" = None) -> None:
        self.correlator = correlator
        self.yara_scanner = yara_scanner
        self.counters: dict[str, int] = {"yara_scans": 0}
        self._time_bucket: int | None = None   # the clock period of the last score (see score)
        self.ruleset: RuleSet | None = None
        correlator.on_new_facts = self._enrich
        self.set_ruleset(ruleset)

    def set_ruleset(self, ruleset: RuleSet | None) -> None:
        """Use a new rule set (hot reload): every process is rescored on the next :meth:`score`."""
        self.ruleset = ruleset
        self.correlator.set_policy(rescore_policy(ruleset))

    def score(self, now: float, *, everything: bool = False) -> list[Verdict]:
        """Rescore processes whose state changed (all with ``everything``); returns their new
        verdicts, oldest process first.

        When a rule reads a signal that moves with the clock alone (an ioctl rate,
        ``age_s``, ``hour_of_day``), every process is also rescored once per period of
        that signal (10 s, a minute, an hour), so such a verdict does not wait for the
        process's next event.
        """
        ruleset = self.ruleset
        if ruleset is None:
            raise ValueError("DetectionEngine.score needs a rule set")
        correlator = self.correlator
        states = correlator.unordered_states()
        period = ruleset.time_rescore_period_s
        if period:
            bucket = int(now // period)
            if self._time_bucket is not None and bucket != self._time_bucket:
                everything = True
            self._time_bucket = bucket
        if everything:
            for state in states:
                state.dirty = True
        out: list[Verdict] = []
        for _ in range(_MAX_PARENT_PASSES):   # parents first; a changed parent re-dirties its children
            dirty = [s for s in states if s.dirty]
            if not dirty:
                break
            dirty.sort(key=lambda s: (s.key.start_time, s.key.pid))
            changed: set[ProcessKey] = set()
            for state in dirty:
                previous = state.verdict
                parent = correlator.parent_of(state)
                state.parent_verdict = parent.verdict if parent else None
                verdict = score_process(state, ruleset, now)
                state.verdict = verdict
                state.dirty = False
                out.append(verdict)
                if previous is None or (previous.verdict, previous.score) != (verdict.verdict, verdict.score):
                    changed.add(state.key)     # children read parent_verdict / parent_score
            if not changed:
                break
            for state in states:
                if state.parent_key in changed:
                    state.dirty = True
        latest = {v.key: v for v in out}
        return sorted(latest.values(), key=lambda v: (v.key.start_time, v.key.pid))

    def verdicts(self, now: float) -> list[Verdict]:
        """The current verdict of every tracked process (rescoring the changed ones)."""
        self.score(now)
        return [s.verdict for s in self.correlator.states() if s.verdict is not None]

    def _enrich(self, state: ProcessState, facts: ProcessFacts) -> None:
        """New facts (first sight, or exec): YARA scan once per image; exe hash when the allowlist pins one."""
        correlator = self.correlator
        if self.yara_scanner is not None and not state.yara_scanned and not facts.kernel_thread:
            result = self.yara_scanner.scan_process(facts, correlator.proc_root)
            state.add_yara_result(result.rules, result.tags, scanned=True)
            self.counters["yara_scans"] += 1
        if self.ruleset is not None and correlator.facts_provider is not None:
            state.exe_sha256 = self.ruleset.allowlist.exe_sha256_if_needed(facts, correlator.proc_root)
