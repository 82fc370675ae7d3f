"""The agent: runs its start-up, then the seven stages in flow order each loop turn, then teardown.

produce -> enrich -> correlate -> score -> report -> act -> emit.  Start-up (:mod:`.startup`)
builds the stages once (:mod:`.wiring`); housekeeping, reload, the state file and teardown
have their modules.
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
from gpuguard.agent.host import StartRefused
from gpuguard.agent.housekeeping import HOUSEKEEPING_S
from gpuguard.agent.intake import BoundedQueue
from gpuguard.agent.schedule import Schedule
from gpuguard.agent.stages import Stages
from gpuguard.agent.stages.s1_produce import BATCH_ITEMS
from gpuguard.agent.teardown import teardown
from gpuguard.agent.telemetry import AgentTelemetry
from gpuguard.agent.wiring import Opened, Wired, agent_parts


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
        self.telemetry.nudge_loop = self.intake.nudge  # a scrape asks the loop for fresh totals
        counters.intake_capacity = config.intake_queue
        self.stop = threading.Event()
        self.ready = threading.Event()  # set once start-up finished (tests, selftest)
        self.ctx = ctx = AgentContext(
            config, counters, self.telemetry, self.intake, self.stop, stderr, proc_root
        )
        self.emit = ctx.emit  # queue a record for the log (any thread)
        self.parts = agent_parts(ctx, sampler_openers, config_path, overrides or {})
        self.findings, self.host_findings = self.parts.findings, self.parts.host_findings
        self.opened = Opened()  # what start-up opened: the rules, the sensor, the stages
        self.housekeeping_s = HOUSEKEEPING_S
        self.hup = False  # SIGHUP seen: reload on the next loop turn
        self.unfed: list = []  # the rest of a batch cut short by a stop or reload
        self.refused: StartRefused | None = None  # start-up failed: the step, and why

    @property
    def config(self) -> AgentConfig:
        return self.ctx.config  # replaced on a SIGHUP reload

    @property
    def correlator(self) -> Any:
        wired = self.opened.wired
        return wired.stages.correlate.correlator if wired is not None else None

    @property
    def responder(self) -> Any:
        wired = self.opened.wired
        return wired.stages.act.responder if wired is not None else None

    def _intake_dropped(self, producer: str, count: int) -> None:
        self.counters.intake_dropped[producer] += count

    def request_stop(self) -> None:
        self.stop.set()
        self.intake.wake()
        if self.opened.wired is not None:  # the sensor ends its read of the ring now
            self.opened.wired.stages.produce.stop_reading()

    def request_reload(self) -> None:
        self.hup = True
        self.intake.nudge()  # the idle loop may be asleep until its next deadline

    def run(self) -> int:
        try:
            startup.run(self)
            if self.opened.wired is not None:
                self._loop(self.opened.wired)
        finally:
            teardown(self)
        return 0

    def feed(self, items: list, cut: Callable[[], bool] | None = None) -> list:
        """Enrich (every /proc read and YARA scan) then correlate; what ``cut()`` left unfed."""
        s = self._stages()
        return s.correlate.feed(items, s.enrich, cut)

    def score_and_report(self, now: float) -> None:
        """Score, report, act on the alerts; then the updates and closes due (listing the acts)."""
        s = self._stages()
        s.act.run(s.report.run(s.score.run(now), now), now)
        s.report.write_lifecycle(now)

    def _stages(self) -> Stages:
        if self.opened.wired is None:
            raise RuntimeError("the stages are built by start-up's stages step")
        return self.opened.wired.stages

    def _loop(self, wired: Wired) -> None:
        s, reloader, housekeeping = wired.stages, wired.reloader, wired.housekeeping
        plan = Schedule(
            most_idle_wait_s=lambda: self.config.health_stall_s / 3,
            host=lambda: self.config.host_check_interval_s,
            housekeeping=lambda: self.housekeeping_s,
            status=lambda: self.config.status_interval_s,
        )
        cut = lambda: self.hup or self.stop.is_set()  # noqa: E731 - a batch's stop test
        while not self.stop.is_set():
            self.telemetry.loop_turned()  # /healthz liveness (and its fault-injection stall)
            unfed = self.unfed  # a batch cut short by a stop or reload: fed first
            wait = 0.0 if unfed else plan.wait_s()
            items = unfed + s.produce.take(wait, BATCH_ITEMS - len(unfed))  # 1 produce
            now = time.time()
            self.unfed = s.correlate.feed(items, s.enrich, cut)  # 2 enrich, 3 correlate
            if self.stop.is_set():
                break  # the teardown feeds what is left, for a bounded time, and scores
            s.act.take_later()  # outcomes the responder's threads reported
            plan.turn(news=self.intake.had_news() or bool(unfed) or self.hup)
            if self.hup:
                self.hup = False
                reloader.reload("SIGHUP")
            elif plan.due("rules"):
                reloader.check_rule_files()
            self.score_and_report(now)  # 4 score, 5 report, 6 act
            if plan.due("guard"):
                s.act.run(s.report.check_guard_policies(now), now)
            if plan.due("host"):
                s.report.check_host_findings(now)
            s.emit.sync_log()  # 7 emit
            if plan.due("housekeeping"):
                plan.half_step("housekeeping", housekeeping.run(now, self.housekeeping_s))
            s.emit.status_due(now, plan.due("status"))
