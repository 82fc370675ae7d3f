"""Stage 4, score: the detection engine's verdicts for the processes that changed.

The engine (:class:`~gpuguard.detect.scoring.engine.DetectionEngine`) evaluates and returns a
:class:`~gpuguard.correlate.correlator.Scoring`; the correlator keeps it (it owns its
states); this stage hands the verdicts on: to the report stage (the caller) and, as
feedback, to the sensor (activity records for a process scored at least
``sessions.watch_score``; the later execs of a suspicious or malicious process in full; the
image of a clean one, whose later execs the sensor may hold).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gpuguard.agent.context import AgentContext
from gpuguard.correlate.correlator import Correlator
from gpuguard.correlate.state import ProcessKey
from gpuguard.detect.ruleset.model import ALERT_VERDICTS
from gpuguard.detect.scoring.engine import DetectionEngine
from gpuguard.detect.scoring.score import Verdict


class ScoreStage:
    """Rescoring passes, timed; sensor feedback once per process."""

    def __init__(
        self,
        ctx: AgentContext,
        correlator: Correlator,
        engine: DetectionEngine,
        request: Callable[..., None] | None,
    ) -> None:
        self.ctx = ctx
        self.correlator, self.engine = correlator, engine
        self.request = request  # feedback for the sensor (None: no sensor, reduced mode)
        self.session_watched: set[ProcessKey] = set()  # given activity records for their score
        self.exec_marked: set[ProcessKey] = set()  # execs in full for their score (exec filter)
        self.counts = {"verdicts": 0, "watch_requests": 0, "interest_requests": 0}

    def run(self, now: float) -> list[Verdict]:
        """Evaluate, let the correlator keep the result, send the sensor its feedback."""
        started = time.perf_counter()
        scoring = self.engine.evaluate(now)
        self.correlator.apply_scoring(scoring)
        verdicts = scoring.verdicts
        elapsed = time.perf_counter() - started
        counters = self.ctx.counters
        counters.observe_scoring(elapsed)
        self.ctx.telemetry.observe_scoring(elapsed)
        counters.processes_tracked = len(self.correlator)
        self.counts["verdicts"] += len(verdicts)
        if self.request is not None and verdicts:
            self._watch_sessions(verdicts)
            self._mark_exec_interest(verdicts)
        return verdicts

    def _watch_sessions(self, verdicts: list[Verdict]) -> None:
        """Processes scored at least ``sessions.watch_score`` get activity records for their
        connections (GPU holders have them from their first GPU open), once each."""
        threshold = self.ctx.config.session_watch_score
        if threshold <= 0:
            return
        for verdict in verdicts:
            if verdict.score >= threshold and verdict.key not in self.session_watched:
                self.session_watched.add(verdict.key)
                self.counts["watch_requests"] += 1
                self.request("watch", verdict.pid)

    def _mark_exec_interest(self, verdicts: list[Verdict]) -> None:
        """A suspicious or malicious process gets its later execs, and its tree's, in full (the
        sensor's exec filter keeps plain ones in the kernel); once each.  Not every process with
        a score: a benign flood from /tmp would send its whole tree up."""
        for verdict in verdicts:
            if verdict.verdict in ALERT_VERDICTS and verdict.key not in self.exec_marked:
                self.exec_marked.add(verdict.key)
                self.counts["interest_requests"] += 1
                self.request("interest", verdict.pid)

    def prune(self) -> None:
        """Forget the processes the correlator no longer tracks (housekeeping)."""
        get = self.correlator.get
        self.session_watched = {k for k in self.session_watched if get(k) is not None}
        self.exec_marked = {k for k in self.exec_marked if get(k) is not None}
