"""The agent: builds its stages (:mod:`gpuguard.agent.stages`) and orders them.

produce -> enrich -> correlate -> score -> report -> act -> emit; start-up (:mod:`.startup`),
housekeeping, reload, the state file (:mod:`.stages.s7_emit.status_writer`) and teardown have their modules.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuguard.agent import startup
from gpuguard.agent.config import AgentConfig
from gpuguard.agent.context import AgentContext, stderr_line
from gpuguard.agent.counters import AgentCounters
from gpuguard.agent.housekeeping import HOUSEKEEPING_S, Housekeeping
from gpuguard.agent.intake import BoundedQueue
from gpuguard.agent.reload import Reloader
from gpuguard.agent.schedule import Schedule
from gpuguard.agent.stages.s1_produce import BATCH_ITEMS, ProduceStage
from gpuguard.agent.stages.s2_enrich import EnrichStage
from gpuguard.agent.stages.s3_correlate import CorrelateStage
from gpuguard.agent.stages.s4_score import ScoreStage
from gpuguard.agent.stages.s5_report import ReportStage
from gpuguard.agent.stages.s6_act import ActStage
from gpuguard.agent.stages.s7_emit import EmitStage
from gpuguard.agent.teardown import teardown
from gpuguard.agent.telemetry import AgentTelemetry


class Agent:
    """One running agent.  ``run()`` blocks until SIGTERM/SIGINT (or :meth:`request_stop`)."""

    def __init__(
        self,
        config: AgentConfig,
        *,
        config_path: Path | None = None,
        overrides: dict[str, Any] | None = None,
        sampler_openers: dict[str, Callable[[], Any]] | None = None,
        install_signals: bool = True,
        proc_root: str = "/proc",
        stderr: Callable[[str], None] = stderr_line,
    ) -> None:
        self.install_signals = install_signals
        self.counters = counters = AgentCounters(mode=config.mode)
        self.telemetry = AgentTelemetry(config, counters, stderr)  # the log and the metrics
        self.intake = BoundedQueue(config.intake_queue, on_drop=self._intake_dropped)
        counters.intake_capacity = config.intake_queue
        self.stop = threading.Event()
        self.ready = threading.Event()  # set once start-up finished (tests, selftest)
        self.ctx = ctx = AgentContext(
            config, counters, self.telemetry, self.intake, self.stop, stderr, proc_root
        )
        self.emit = ctx.emit  # queue a record for the log (any thread)
        self.produce = ProduceStage(ctx, sampler_openers)
        self.enrich = EnrichStage(ctx)
        self.report = ReportStage(ctx)
        self.host_findings = self.report.host_findings
        self.correlate = CorrelateStage(ctx, self.host_findings.observe, self.host_findings.INPUTS)
        self.score = ScoreStage(ctx)
        self.act = ActStage(ctx, self.report.findings)
        self.emit_stage = EmitStage(ctx)
        self.findings = self.report.findings
        self.housekeeping = Housekeeping(ctx, self.produce, self.score, self.report, self.act)
        self.housekeeping_s = HOUSEKEEPING_S
        self.unfed: list = []  # the rest of a batch cut short by a stop or reload
        self.reloader = Reloader(
            ctx, config_path, overrides or {}, self.produce, self.enrich, self.score, self.act
        )

    @property
    def config(self) -> AgentConfig:
        return self.ctx.config  # replaced on a SIGHUP reload

    @property
    def correlator(self) -> Any:
        return self.correlate.correlator

    @property
    def responder(self) -> Any:
        return self.act.responder

    def _intake_dropped(self, producer: str, count: int) -> None:
        self.counters.intake_dropped[producer] += count

    def request_stop(self) -> None:
        self.stop.set()
        self.intake.wake()
        self.produce.stop_reading()  # the sensor ends its read of the ring now, not at its end

    def request_reload(self) -> None:
        self.reloader.hup = True
        self.intake.nudge()  # the idle loop may be asleep until its next deadline

    def run(self) -> int:
        try:
            for step in startup.STEPS:
                if self.stop.is_set():
                    break
                step(self)
            self._loop()
        finally:
            teardown(self)
        return 0

    def feed(self, items: list, cut: Callable[[], bool] | None = None) -> list:
        """Enrich (every /proc read and YARA scan) then correlate; what ``cut()`` left unfed."""
        return self.correlate.feed(items, self.enrich, cut)

    def score_and_report(self, now: float) -> None:
        self.report.run(self.score.run(now), now)  # act: called by report for each alert

    def _loop(self) -> None:
        produce, reloader, report, emit = self.produce, self.reloader, self.report, self.emit_stage
        plan = Schedule(
            host=lambda: self.config.host_check_interval_s,
            housekeeping=lambda: self.housekeeping_s,
            status=lambda: self.config.status_interval_s,
        )
        cut = lambda: reloader.hup or self.stop.is_set()  # noqa: E731 - a batch's stop test
        while not self.stop.is_set():
            self.telemetry.loop_turned()  # /healthz liveness (and its fault-injection stall)
            unfed = self.unfed  # a batch cut short by a stop or reload: fed first
            wait = 0.0 if unfed else plan.wait_s()
            items = unfed + produce.take(wait, BATCH_ITEMS - len(unfed))
            now = time.time()
            self.unfed = self.feed(items, cut)
            if self.stop.is_set():
                break  # the teardown feeds what is left, for a bounded time, and scores
            self.act.take_later()  # outcomes the responder's threads reported
            plan.turn()
            if reloader.hup:
                reloader.hup = False
                reloader.reload("SIGHUP")
            elif plan.due("rules"):
                reloader.check_rule_files()
            self.score_and_report(now)
            if plan.due("guard"):
                report.check_guard_policies(now)
            if plan.due("host"):
                report.check_host_findings(now)
            emit.sync_log()
            if plan.due("housekeeping"):
                self.housekeeping.run(now, self.housekeeping_s)
            emit.status_due(now, plan.due("status"))
