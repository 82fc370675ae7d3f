"""Stage 6, act: the alerts the report stage returned, handed to the responder; its outcomes.

The responder (:mod:`gpuguard.agent.actions`) is built with the stage and again on a config
reload.  Outcomes known at once are recorded as the responder returns them; outcomes that come later
from the responder's own threads (SIGKILL after the grace, hook results, kill-on-touch kills)
go into an explicit queue (:class:`~gpuguard.agent.feedback.FeedbackQueue`) the loop drains
each turn, so only the loop thread touches the counters and findings.  Each outcome is
counted, kept for the state file and logged.  An acting agent also lets the responder lift
expired blocks (housekeeping).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuguard.agent.actions import Alert, make_responder
from gpuguard.agent.context import AgentContext
from gpuguard.agent.counters import AgentCounters
from gpuguard.agent.feedback import FeedbackQueue
from gpuguard.agent.stages.s5_report.findings import ProcessFindings
from gpuguard.escape import escape_text
from gpuguard.events.agent_events import ActionOutcome
from gpuguard.respond import Responder
from gpuguard.respond.actions import touch_kill_of
from gpuguard.sources.proc.identity import ExitGenerations
from gpuguard.sources.proc.pod_names import pod_names_for


def record_outcomes(
    counters: AgentCounters,
    findings: ProcessFindings,
    emit: Callable[[Any], None],
    outcomes: list[ActionOutcome],
) -> None:
    """Count each action outcome, keep the latest for the state file, and log it."""
    for outcome in outcomes:
        counters.actions[(outcome.action, outcome.status)] += 1
        if outcome.pid:
            findings.note_action(
                outcome.pid, outcome.start_time, outcome.action, outcome.status, outcome.time
            )
        touch = touch_kill_of(outcome)
        if touch is not None:  # a kill the kernel made (not a placement): by reason
            counters.touch_kills[touch] += 1
        counters.last_actions.append(
            {
                "time": outcome.time,
                "pid": outcome.pid,
                "action": outcome.action,
                "status": outcome.status,
                "reason": escape_text(outcome.reason),
            }
        )
        emit(outcome)


class ActStage:
    """The responder for the current config, and the record of every outcome."""

    def __init__(
        self,
        ctx: AgentContext,
        findings: ProcessFindings,
        exit_generations: ExitGenerations | None,
    ) -> None:
        self.ctx = ctx
        self.findings = findings
        self.exit_generations = exit_generations  # the sensor's (None in reduced mode)
        self.later = FeedbackQueue()  # outcomes from the responder's threads
        # alerts handed to the responder; those where it raised (each an outcome "failed")
        self.counts = {"acted": 0, "failed": 0}
        self.responder: Responder | None = self._responder()  # None once closed

    def _responder(self) -> Responder:
        config = self.ctx.config
        responder = make_responder(
            config.response,
            config.mode,
            config.dry_run,
            self.later.put,
            self.exit_generations,
            pod_names_for(config.kubernetes_log_root, config.containerd_root),
        )
        self.ctx.counters.mode = config.mode  # once the responder for it is there
        return responder

    def rebuild(self) -> None:
        """A responder for a reloaded config; the previous one is closed first (its pinned
        blocks stay) and what it reported later is recorded."""
        self.close()
        self.responder = self._responder()

    def run(self, alerts: list[Alert], now: float) -> None:
        """Act on the alerts the report stage returned, in order."""
        for alert in alerts:
            self.act(alert.verdict, alert.state, now, alert.finding)

    def act(self, verdict: Any, state: Any, now: float, finding: dict | None = None) -> None:
        """Hand an alert (and its finding document, for hooks) to the responder; a failing action
        is an outcome, not a crash."""
        self.counts["acted"] += 1
        try:
            intent = self.responder.intent(verdict)
            outcomes = self.responder(verdict, state, now, finding)
        except Exception as exc:  # noqa: BLE001 - a failing action is an outcome, not a crash
            self.counts["failed"] += 1
            outcomes = [
                ActionOutcome(
                    time=now,
                    action=verdict.action,
                    status="failed",
                    pid=verdict.pid,
                    comm=verdict.comm,
                    verdict=verdict.verdict,
                    score=verdict.score,
                    reason=f"{type(exc).__name__}: {exc}",
                )
            ]
            intent = None
        if intent is not None:
            taken = {o.action for o in outcomes if o.status == "done"}
            name = f"{escape_text(verdict.comm)}({verdict.pid})"
            self.ctx.counters.count_intent(intent.per_rule, taken, intent.enforcing, name)
        self.record(outcomes)

    def intent_json(self, verdict: Any) -> dict | None:
        """The record's ``response``: what enforce would do, rule by rule, and why not."""
        if self.responder is None:
            return None
        return self.responder.intent(verdict).to_json()

    def record(self, outcomes: list[ActionOutcome]) -> None:
        record_outcomes(self.ctx.counters, self.findings, self.ctx.emit, outcomes)

    def take_later(self) -> None:
        """Record the outcomes the responder's threads reported since the last turn."""
        if len(self.later):
            self.record(self.later.drain())

    def sweep_blocks(self, now: float) -> None:
        """The responder lifts expired blocks and stops again a suspended process something resumed.

        Only an acting agent (enforce, not a dry run) touches blocks: monitor mode never acts.
        """
        if not self.responder.acting:
            return
        try:
            outcomes = self.responder.sweep(now)
        except Exception as exc:  # noqa: BLE001 - a failing sweep is reported, detection goes on
            self.ctx.lifecycle(
                "fault", f"lifting expired blocks failed: {type(exc).__name__}: {exc}"
            )
            return
        self.record(outcomes)

    def close(self) -> None:
        """Close the responder (waits for pending kills; pinned blocks stay) and record what
        it reported meanwhile."""
        if self.responder is not None:
            responder, self.responder = self.responder, None
            try:
                responder.close()
            finally:
                self.take_later()
