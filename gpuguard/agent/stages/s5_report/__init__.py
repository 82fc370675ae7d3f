"""Stage 5, report: findings from verdicts, written as the finding lifecycle says.

Process findings (:mod:`.findings`): a create when a verdict first crosses a threshold or a
``gpu-abuse`` rule first matches, coalesced updates as the evidence grows, a close when the
process ends; creates and escalations are returned as alerts, which the pipeline hands to the
act stage.  Every few seconds the guard policies are checked over the live processes
(reported on first breach or when the verdict or broken policies change), and the GPU host
checks run (:mod:`.host_findings`, never acted on).  The open findings are kept on disk
(:mod:`.finding_ledger`) for a restarted agent.

May import: the agent's shared modules (context, actions) and the layers below the agent;
never a later stage nor the pipeline.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuguard.agent.actions import Alert
from gpuguard.agent.context import AgentContext
from gpuguard.agent.stages.s5_report.finding_ledger import ledger_path, load_ledger, save_ledger
from gpuguard.agent.stages.s5_report.findings import ProcessFindings, Write
from gpuguard.agent.stages.s5_report.host_findings import GpuHostFindings
from gpuguard.correlate.correlator import Correlator
from gpuguard.correlate.state import ProcessKey
from gpuguard.detect.guard_policies import evaluate_guard_policies
from gpuguard.detect.ruleset.model import ALERT_VERDICTS
from gpuguard.detect.ruleset.reload import RuleSetHolder
from gpuguard.escape import escape_text
from gpuguard.outputs.finding import finding_from_verdict
from gpuguard.outputs.finding_document import finding_document, status_row
from gpuguard.sources.proc.files import ExeHashes
from gpuguard.sources.proc.pod_names import pod_names_for


def report_parts(ctx: AgentContext) -> tuple[ProcessFindings, GpuHostFindings]:
    """The process findings (create, coalesced updates, close) and the GPU host findings
    (orphaned GPU memory, past GPU users, host tuning, read under the root that holds
    ``proc_root``): built with the agent, before start-up (they read nothing until used)."""
    config = ctx.config
    return (
        ProcessFindings(
            config.finding_update_interval_s,
            exe_hash=ExeHashes(ctx.proc_root).of,
            run_id=ctx.counters.run_id,
            pod_names=pod_names_for(config.kubernetes_log_root, config.containerd_root),
        ),
        GpuHostFindings(config.host_check_interval_s, str(Path(ctx.proc_root).parent)),
    )


class ReportStage:
    """Process, guard and GPU host findings; see the module docstring."""

    def __init__(
        self,
        ctx: AgentContext,
        rules: RuleSetHolder,
        correlator: Correlator,
        findings: ProcessFindings,
        host_findings: GpuHostFindings,
        intent: Callable[[Any], dict | None] = lambda verdict: None,
    ) -> None:
        self.ctx, self.rules, self.correlator = ctx, rules, correlator
        self.intent = intent  # the act stage's: what enforce would do with a verdict, and why not
        self.findings, self.host_findings = findings, host_findings
        self.guard_reported: dict[ProcessKey, tuple] = {}  # guard verdict and policies last written
        self.counts = {"written": 0, "ledger_saves": 0}  # records written; ledger rewrites

    def run(self, verdicts: list, now: float) -> list[Alert]:
        """The records the verdicts of one scoring pass make; the creates and escalations to
        act on.  The coalesced updates and closes (:meth:`write_lifecycle`) come after the
        acting, so a close lists what was done."""
        get = self.correlator.get
        findings = self.findings
        alerts: list[Alert] = []
        for verdict in verdicts:
            write = findings.scored(verdict, get(verdict.key), now)
            if write is not None:
                self.report(verdict, alerts if write.act else None, write)
        return alerts

    def write_lifecycle(self, now: float, final: bool = False) -> None:
        """The coalesced updates now due and the closes of processes that ended."""
        self.findings.update_interval_s = self.ctx.config.finding_update_interval_s  # SIGHUP-able
        for write in self.findings.poll(self.correlator.get, now, final):
            self.report(write.verdict, None, write)
        if self.findings.changed:
            self.save_ledger()

    def resume(self) -> None:
        """The findings the last run left open (the ledger beside the state file): a process
        still running under one of them is continued, not reported as new."""
        carried, problem = load_ledger(ledger_path(self.ctx.config.status_path))
        if problem:
            self.ctx.stderr(f"gpuguard: {problem}; its findings are reported as new")
        self.findings.carry(carried)

    def save_ledger(self) -> None:
        """Rewrite the ledger; a failure is counted with the state file's (the next change
        tries again)."""
        counters = self.ctx.counters
        try:
            save_ledger(
                ledger_path(self.ctx.config.status_path), counters.run_id, self.findings.ledger()
            )
        except OSError as exc:
            counters.status_errors += 1
            counters.last_status_error = exc.strerror or str(exc)
            return
        self.counts["ledger_saves"] += 1

    def report(self, verdict: Any, alerts: list[Alert] | None, write: Write | None = None) -> None:
        """Write one record; a counted alert verdict goes on ``alerts`` (None: never acted on)."""
        ctx, counters = self.ctx, self.ctx.counters
        state = self.correlator.get(verdict.key)
        facts = state.facts if state is not None else None
        finding = finding_from_verdict(verdict, facts, self.rules.current, state)
        if write is not None:
            self.findings.stamp(finding, write)
        else:  # a guard-policy verdict (the only one reported without a lifecycle write)
            self.findings.stamp_guard(finding, verdict.key)
        if alerts is not None and verdict.verdict in ALERT_VERDICTS:
            finding.response = self.intent(verdict)  # the record says what enforce would do
        ctx.emit(finding)
        self.counts["written"] += 1
        if write is not None and not write.counts:
            return  # a plain update or a close: written, not counted again, never acted on
        counters.findings[(finding.rule_id, verdict.verdict)] += 1
        found = time.time()  # after scoring: the moment the finding exists (time to detect)
        counters.last_findings.append(status_row(finding, found))
        ctx.status_soon = True
        if alerts is not None and verdict.verdict in ALERT_VERDICTS and not verdict.allowlisted:
            alerts.append(Alert(verdict, state, finding_document(finding)))

    def check_guard_policies(self, now: float) -> list[Alert]:
        """Guard verdicts, reported on first breach or when the verdict or the broken policies
        change; the alerts to act on."""
        policies = self.ctx.config.guard_policies
        alerts: list[Alert] = []
        if not policies:
            self.guard_reported.clear()
            return alerts
        breached: dict[ProcessKey, tuple] = {}
        for verdict in evaluate_guard_policies(
            policies, list(self.correlator.unordered_states()), now
        ):
            said = (verdict.verdict, tuple(sorted({e.rule_id for e in verdict.evidence})))
            breached[verdict.key] = said
            if self.guard_reported.get(verdict.key) != said:
                self.report(verdict, alerts)
        self.guard_reported = (
            breached  # a process back within every policy is reported again on a new breach
        )
        return alerts

    def check_host_findings(self, now: float) -> None:
        """GPU host findings (orphaned memory: logged when it appears, changes materially or goes away,
        and kept for status and metrics; past heavy users: logged once).  Never handed to the responder:
        there is no offender process to stop safely."""
        ctx, counters = self.ctx, self.ctx.counters
        try:
            records = self.host_findings.check(now, self.rules.current.thresholds)
        except Exception as exc:  # noqa: BLE001 - a failing check is reported, detection goes on
            ctx.lifecycle("fault", f"GPU host checks failed: {type(exc).__name__}: {exc}")
            return
        for finding in records:
            ctx.emit(finding)
            if finding.activity != "close":
                counters.findings[(finding.rule_id, finding.verdict)] += 1
        if records:
            counters.host_findings = [
                {**row, "detail": escape_text(row["detail"])} for row in self.host_findings.active()
            ]
            counters.host_findings_active = self.host_findings.active_by_rule()
            ctx.status_soon = True

    def prune(self) -> None:
        """Forget the guard bookkeeping and closed findings of processes the correlator no longer
        tracks."""
        get = self.correlator.get
        for key in [k for k in self.guard_reported if get(k) is None]:
            del self.guard_reported[key]
        self.findings.forget_closed(get)
