"""The detection engine: scores the correlator's processes with a rule set, parents first.

Wiring (``scan``, golden cases and the agent)::

    correlator = Correlator(facts_provider=...)
    engine = DetectionEngine(correlator, ruleset, yara_scanner=scanner)
    correlator.feed(item) ...           # any number of items
    verdicts = engine.score(now)        # the processes that changed (evaluate + apply_scoring)
    engine.set_ruleset(new_ruleset)     # hot reload: every living process is rescored next time

:meth:`DetectionEngine.evaluate` writes nothing into the correlator's states: it returns a
:class:`~gpuguard.correlate.correlator.Scoring` that the correlator applies.  Details:
docs/internals.md, "engine".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuguard.correlate.correlator import Correlator, RescorePolicy, Scoring
from gpuguard.correlate.state import ProcessKey, ProcessState
from gpuguard.detect.ruleset.load import RuleSet
from gpuguard.detect.scoring.score import Verdict, score_process
from gpuguard.detect.signals.memo import entries_of, keep, kept
from gpuguard.detect.signals.reader import SignalReader
from gpuguard.detect.signals.rescore import AGE_CHECK_EVERY_S, GPU_CHECK_EVERY_S
from gpuguard.events.process_facts import ProcessFacts

if TYPE_CHECKING:
    from gpuguard.detect.yara.scan import YaraScanner

_MAX_PARENT_PASSES = 10  # a chain of changed parents deeper than this waits for the next score
_GPU_ANSWERS = "gpu-answers"  # in detect's memo: (rule set, time, answers of its GPU tests)


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
        if correlator.on_new_facts is None:  # the agent's enrich stage comes with its own
            correlator.on_new_facts = self._enrich
        self.set_ruleset(ruleset)

    def set_ruleset(self, ruleset: RuleSet | None) -> None:
        """Use a new rule set (hot reload): every living process is rescored on the next
        :meth:`score`; an ended one judged since its end is never judged again."""
        self.ruleset = ruleset
        self._age_checked_at = None
        self.correlator.set_policy(rescore_policy(ruleset))

    def score(self, now: float, *, everything: bool = False) -> list[Verdict]:
        """:meth:`evaluate`, applied to the correlator's states (``scan``, golden cases, tests);
        returns the new verdicts, oldest process first."""
        scoring = self.evaluate(now, everything=everything)
        self.correlator.apply_scoring(scoring)
        return scoring.verdicts

    def evaluate(self, now: float, *, everything: bool = False) -> Scoring:
        """Rescore processes whose state changed (every living one with ``everything``); the new
        verdicts and what the correlator is to keep of them (:class:`Scoring`).  Nothing is
        written to the correlator's states: the caller hands the result to
        ``Correlator.apply_scoring``.

        When a rule reads a signal that moves with the clock alone (an ioctl rate,
        ``hour_of_day``), every living process is also rescored once per period of that signal
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
        scoring = Scoring()
        period = ruleset.time_rescore_period_s
        if period:
            bucket = int(now // period)
            if self._time_bucket is not None and bucket != self._time_bucket:
                everything = True
            self._time_bucket = bucket
        dirty = set(correlator.dirty)  # the correlator's marks (no walk of every state), then ours
        if everything:  # the living: an ended process judged since its end is not judged again
            dirty.update(s for s in states if not s.exited)
        elif ruleset.age_crossings:
            self._mark_age_crossings(ruleset.age_crossings, now, dirty)
        gpu_tests = ruleset.gpu_sample_tests
        readers = (
            self._check_gpu_moves(ruleset, gpu_tests, now, dirty, scoring)
            if correlator.gpu_moved
            else {}
        )
        scoring.marked = set(dirty)
        pending = scoring.scored  # state -> (its newest verdict, the parent verdict it read)
        alike: dict = {}  # outcomes shared by processes with equal inputs, for this pass only
        out: list[Verdict] = []
        for _ in range(
            _MAX_PARENT_PASSES
        ):  # parents first; a changed parent re-dirties its children
            if not dirty:
                break
            order = sorted(dirty, key=lambda s: (s.key.start_time, s.key.pid))
            changed: dict[ProcessKey, int] = {}  # key -> its place in this pass
            scored: dict[ProcessKey, int] = {}
            for place, state in enumerate(order):
                previous = pending[state][0] if state in pending else state.verdict
                parent = correlator.parent_of(state)
                if parent is None:
                    parent_verdict = None
                else:
                    parent_verdict = pending[parent][0] if parent in pending else parent.verdict
                reader = readers.pop(state, None) or SignalReader(state, now)
                reader["parent_verdict"] = _parent_value(parent_verdict, "verdict")
                reader["parent_score"] = _parent_value(parent_verdict, "score")
                verdict = score_process(state, ruleset, now, reader, alike)
                if gpu_tests and state.gpu_rescored_at is not None:
                    keep(
                        reader.memo,
                        state,
                        _GPU_ANSWERS,
                        (ruleset, now, _answers(gpu_tests, reader)),
                    )
                pending[state] = (verdict, parent_verdict)
                dirty.discard(state)
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
                if (
                    place is not None
                    and scored.get(state.key, -1) < place
                    and (not state.exited or state in scoring.marked)  # the dead stay judged
                ):
                    dirty.add(state)
                    scoring.marked.add(state)
        scoring.still_dirty = dirty
        latest = {v.key: v for v in out}
        scoring.verdicts = sorted(latest.values(), key=lambda v: (v.key.start_time, v.key.pid))
        return scoring

    def _mark_age_crossings(
        self, crossings: tuple[tuple[float, bool], ...], now: float, dirty: set[ProcessState]
    ) -> None:
        """Mark (add to ``dirty``) the processes whose age crossed one of ``crossings`` since the
        last look.

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
            if state in dirty or state.exited:  # an ended process's age no longer matters
                continue
            start = state.key.start_time
            before, after = last - start, now - start
            for point, at in crossings:
                if backwards:
                    crossed = after <= point <= before
                else:
                    crossed = (before < point <= after) if at else (before <= point < after)
                if crossed:
                    dirty.add(state)
                    break

    def _check_gpu_moves(
        self,
        ruleset: RuleSet,
        tests: tuple,
        now: float,
        dirty: set[ProcessState],
        scoring: Scoring,
    ) -> dict[ProcessState, SignalReader]:
        """Mark the processes whose GPU windows moved so that a rule's GPU test answers differently.

        Returns the signal readers used for those, so scoring reads each signal once; the
        processes looked at go to ``scoring.gpu_looked`` (the correlator takes them out of
        ``gpu_moved``).
        """
        moved = self.correlator.gpu_moved
        readers: dict[ProcessState, SignalReader] = {}
        if not tests:
            scoring.gpu_looked.update(moved)
            return readers
        for state in list(moved):
            if state in dirty:  # scored anyway (its answers are kept then)
                scoring.gpu_looked.add(state)
                continue
            entries = entries_of(state)
            last = kept(entries, state, _GPU_ANSWERS)
            if last is not None and last[0] is ruleset and 0 <= now - last[1] < GPU_CHECK_EVERY_S:
                continue  # looked at less than GPU_CHECK_EVERY_S ago: stays in moved
            scoring.gpu_looked.add(state)
            reader = SignalReader(state, now)
            answers = _answers(tests, reader)
            if last is None or last[0] is not ruleset or last[2] != answers:
                dirty.add(state)
                readers[state] = reader
            else:
                keep(entries, state, _GPU_ANSWERS, (ruleset, now, answers))
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


def _parent_value(verdict: Verdict | None, field: str) -> object:
    """The parent's verdict or score as the ``parent_verdict`` / ``parent_score`` signals say it."""
    return getattr(verdict, field) if verdict is not None else None


def _answers(tests: tuple, reader: SignalReader) -> int:
    """The answers of ``tests`` as bits (bit i: test i matched)."""
    bits = 0
    for i, test in enumerate(tests):
        if test(reader) is not None:
            bits |= 1 << i
    return bits
