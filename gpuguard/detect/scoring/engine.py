"""The detection engine: scores the correlator's processes with a rule set, parents first.

Wiring (``scan``, golden cases and the agent)::

    correlator = Correlator(facts_provider=...)
    engine = DetectionEngine(correlator, ruleset, yara_scanner=scanner)
    correlator.feed(item) ...           # any number of items
    verdicts = engine.score(now)        # the processes that changed
    engine.set_ruleset(new_ruleset)     # hot reload: everything is rescored next time

The engine gives the correlator a :class:`~gpuguard.correlate.correlator.RescorePolicy`,
enriches new facts through its ``on_new_facts`` hook (YARA, sha256 for pinned allowlist
entries), and rescores only ``dirty`` processes, parents first.  GPU samples and age are
checked here, so they cost a rescore only when they can change a verdict: see docs/rules.md,
"When a process is evaluated again".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuguard.correlate.correlator import Correlator, RescorePolicy
from gpuguard.correlate.state import ProcessKey, ProcessState
from gpuguard.detect.ruleset.load import RuleSet
from gpuguard.detect.scoring.score import Verdict, score_process
from gpuguard.detect.signals.reader import SignalReader
from gpuguard.detect.signals.rescore import AGE_CHECK_EVERY_S, GPU_CHECK_EVERY_S
from gpuguard.events.process_facts import ProcessFacts

if TYPE_CHECKING:
    from gpuguard.detect.yara.scan import YaraScanner

_MAX_PARENT_PASSES = 10  # a chain of changed parents deeper than this waits for the next score
_GPU_ANSWERS = (
    "gpu-answers"  # state.derived: (rule set, time, answers of its GPU tests) at the last look
)


def rescore_policy(ruleset: RuleSet | None) -> RescorePolicy:
    """What the correlator must treat as a change worth rescoring for ``ruleset`` (None: everything)."""
    if ruleset is None:
        return RescorePolicy()
    return RescorePolicy(
        additions=ruleset.rescore_on,
        counts=ruleset.reads_counts,
        rates=ruleset.reads_rates,
        gpu_checked=True,
    )


class DetectionEngine:
    """Rules applied to a correlator's processes; see the module docstring."""

    def __init__(
        self,
        correlator: Correlator,
        ruleset: RuleSet | None,
        *,
        yara_scanner: YaraScanner | None = None,
    ) -> None:
        self.correlator = correlator
        self.yara_scanner = yara_scanner
        self.counters: dict[str, int] = {"yara_scans": 0}
        self._time_bucket: int | None = None  # the clock period of the last score (see score)
        self._age_checked_at: float | None = (
            None  # when ages were last looked at (see _mark_age_crossings)
        )
        self.ruleset: RuleSet | None = None
        correlator.on_new_facts = self._enrich
        self.set_ruleset(ruleset)

    def set_ruleset(self, ruleset: RuleSet | None) -> None:
        """Use a new rule set (hot reload): every process is rescored on the next :meth:`score`."""
        self.ruleset = ruleset
        self._age_checked_at = None
        self.correlator.set_policy(rescore_policy(ruleset))

    def score(self, now: float, *, everything: bool = False) -> list[Verdict]:
        """Rescore processes whose state changed (all with ``everything``); returns their new
        verdicts, oldest process first.

        When a rule reads a signal that moves with the clock alone (an ioctl rate,
        ``hour_of_day``), every process is also rescored once per period of that signal
        (10 s, an hour), so such a verdict does not wait for the process's next event;
        ``age_s`` rescores the processes whose age crossed a number a rule compares it
        with, and GPU samples those whose rules' GPU tests answer differently (see the
        module docstring).
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
        elif ruleset.age_crossings:
            self._mark_age_crossings(ruleset.age_crossings, now)
        gpu_tests = ruleset.gpu_sample_tests
        readers = self._check_gpu_moves(ruleset, gpu_tests, now) if correlator.gpu_moved else {}
        out: list[Verdict] = []
        for _ in range(
            _MAX_PARENT_PASSES
        ):  # parents first; a changed parent re-dirties its children
            dirty = [s for s in states if s.dirty]
            if not dirty:
                break
            dirty.sort(key=lambda s: (s.key.start_time, s.key.pid))
            changed: dict[ProcessKey, int] = {}  # key -> its place in this pass
            scored: dict[ProcessKey, int] = {}
            for place, state in enumerate(dirty):
                previous = state.verdict
                parent = correlator.parent_of(state)
                state.parent_verdict = parent.verdict if parent else None
                reader = readers.pop(state, None) or SignalReader(state, now)
                verdict = score_process(state, ruleset, now, reader)
                if gpu_tests and state.gpu_rescored_at is not None:
                    state.derived[_GPU_ANSWERS] = (ruleset, now, _answers(gpu_tests, reader))
                state.verdict = verdict
                state.dirty = False
                scored[state.key] = place
                out.append(verdict)
                if previous is None or (previous.verdict, previous.score) != (
                    verdict.verdict,
                    verdict.score,
                ):
                    changed[state.key] = place  # children read parent_verdict / parent_score
            if not changed:
                break
            for state in states:
                # a child scored after its parent changed read the new verdict already (scan:
                # every process is new, so this would otherwise score every child twice)
                place = changed.get(state.parent_key)
                if place is not None and scored.get(state.key, -1) < place:
                    state.dirty = True
        latest = {v.key: v for v in out}
        return sorted(latest.values(), key=lambda v: (v.key.start_time, v.key.pid))

    def _mark_age_crossings(self, crossings: tuple[tuple[float, bool], ...], now: float) -> None:
        """Mark the processes whose age crossed one of ``crossings`` since the last look.

        The looks split time into intervals (last, now]; an answer that changes as the age
        reaches a value (gte, lt) changes in exactly one of them, one that changes just after
        it (gt, lte) in exactly one [last, now).  A process scored after the change and before
        the look is rescored once more (harmless); a process is never left out.
        """
        last = self._age_checked_at
        if last is None:
            self._age_checked_at = now  # every process is dirty after set_ruleset: scored now
            return
        if last <= now < last + AGE_CHECK_EVERY_S:
            return
        self._age_checked_at = now
        backwards = now < last  # a clock set back (or a caller scoring an earlier time)
        for state in self.correlator.unordered_states():
            if state.dirty:
                continue
            start = state.key.start_time
            before, after = last - start, now - start
            for point, at in crossings:
                if backwards:
                    crossed = after <= point <= before
                else:
                    crossed = (before < point <= after) if at else (before <= point < after)
                if crossed:
                    state.dirty = True
                    break

    def _check_gpu_moves(
        self, ruleset: RuleSet, tests: tuple, now: float
    ) -> dict[ProcessState, SignalReader]:
        """Mark the processes whose GPU windows moved so that a rule's GPU test answers differently.

        Returns the signal readers used for those, so scoring reads each signal once.
        """
        moved = self.correlator.gpu_moved
        readers: dict[ProcessState, SignalReader] = {}
        if not tests:
            moved.clear()
            return readers
        for state in list(moved):
            if state.dirty:  # scored anyway (its answers are kept then)
                moved.discard(state)
                continue
            kept = state.derived.get(_GPU_ANSWERS)
            if kept is not None and kept[0] is ruleset and 0 <= now - kept[1] < GPU_CHECK_EVERY_S:
                continue  # looked at less than GPU_CHECK_EVERY_S ago: stays in moved
            moved.discard(state)
            reader = SignalReader(state, now)
            answers = _answers(tests, reader)
            if kept is None or kept[0] is not ruleset or kept[2] != answers:
                state.dirty = True
                readers[state] = reader
            else:
                state.derived[_GPU_ANSWERS] = (ruleset, now, answers)
        return readers

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
            state.exe_sha256 = self.ruleset.allowlist.exe_sha256_if_needed(
                facts, correlator.proc_root
            )


def _answers(tests: tuple, reader: SignalReader) -> int:
    """The answers of ``tests`` as bits (bit i: test i matched)."""
    bits = 0
    for i, test in enumerate(tests):
        if test(reader) is not None:
            bits |= 1 << i
    return bits
