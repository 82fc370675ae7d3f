"""Stage 5, report: findings from verdicts, written as the finding lifecycle says.

Process findings (:class:`~gpuguard.agent.findings.ProcessFindings`): a create when a verdict
first crosses a threshold or a ``gpu-abuse`` rule first matches, coalesced updates as the
evidence grows, a close when the process ends; creates and escalations go on to the act
stage.  Every few seconds the config's guard policies are checked over the live processes
(reported on first breach or when the verdict or the broken policies change, with their own
bookkeeping so rule and guard verdicts of one process do not flap), and the GPU host checks
run (:class:`~gpuguard.agent.host_findings.GpuHostFindings`, never acted on).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuguard.agent.context import AgentContext
from gpuguard.agent.finding_ledger import ledger_path, load_ledger, save_ledger
from gpuguard.agent.findings import ProcessFindings, Write
from gpuguard.agent.host_findings import GpuHostFindings
from gpuguard.correlate.state import ProcessKey
from gpuguard.detect.guard_policies import evaluate_guard_policies
from gpuguard.detect.ruleset.model import ALERT_VERDICTS
from gpuguard.escape import escape_text
from gpuguard.outputs.finding import finding_from_verdict
from gpuguard.outputs.finding_document import finding_document, status_row

Act = Callable[[Any, Any, float], None]  # (verdict, state, now): the act stage


class ReportStage:
    """Process, guard and GPU host findings; see the module docstring."""

    def __init__(self, ctx: AgentContext) -> None:
        self.ctx = ctx
        config = ctx.config
        self.correlator: Any = None
        self.act: Act | None = None
        # process findings: create, coalesced updates, close (gpuguard/agent/findings.py)
        self.findings = ProcessFindings(
            config.finding_update_interval_s, proc_root=ctx.proc_root, run_id=ctx.counters.run_id
        )
        # orphaned GPU memory, past GPU users, host tuning (read under the root that holds proc_root)
        self.host_findings = GpuHostFindings(
            config.host_check_interval_s, str(Path(ctx.proc_root).parent)
        )
        self.guard_reported: dict[ProcessKey, tuple] = {}  # guard verdict and policies last written
        self.counts = {
            "written": 0,
            "counted": 0,
            "guard_checks": 0,
            "host_checks": 0,
            "ledger_saves": 0,
        }

    def run(self, verdicts: list, now: float) -> None:
        """The verdicts of one scoring pass, then the coalesced updates and closes now due."""
        get = self.correlator.get
        findings = self.findings
        for verdict in verdicts:
            write = findings.scored(verdict, get(verdict.key), now)
            if write is not None:
                self.report(verdict, now, act=write.act, write=write)
        self.write_lifecycle(now)

    def write_lifecycle(self, now: float, final: bool = False) -> None:
        """The coalesced updates now due and the closes of processes that ended."""
        self.findings.update_interval_s = self.ctx.config.finding_update_interval_s  # SIGHUP-able
        for write in self.findings.poll(self.correlator.get, now, final):
            self.report(write.verdict, now, act=False, write=write)
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

    def report(
        self, verdict: Any, now: float, act: bool = True, write: Write | None = None
    ) -> None:
        ctx, counters = self.ctx, self.ctx.counters
        state = self.correlator.get(verdict.key)
        facts = state.facts if state is not None else None
        finding = finding_from_verdict(verdict, facts, ctx.rules.current, state)
        if write is not None:
            self.findings.stamp(finding, write)
        else:  # a guard-policy verdict (the only one reported without a lifecycle write)
            self.findings.stamp_guard(finding, verdict.key)
        ctx.emit(finding)
        self.counts["written"] += 1
        if write is not None and not write.counts:
            return  # a plain update or a close: written, not counted again, never acted on
        counters.findings[(finding.rule_id, verdict.verdict)] += 1
        self.counts["counted"] += 1
        found = time.time()  # after scoring: the moment the finding exists (time to detect)
        counters.last_findings.append(status_row(finding, found))
        ctx.status_soon = True
        if act and verdict.verdict in ALERT_VERDICTS and not verdict.allowlisted:
            self.act(verdict, state, now, finding_document(finding))

    def check_guard_policies(self, now: float) -> None:
        """Guard verdicts, reported on first breach or when the verdict or the broken policies change."""
        self.counts["guard_checks"] += 1
        policies = self.ctx.config.guard_policies
        if not policies:
            self.guard_reported.clear()
            return
        breached: dict[ProcessKey, tuple] = {}
        for verdict in evaluate_guard_policies(
            policies, list(self.correlator.unordered_states()), now
        ):
            said = (verdict.verdict, tuple(sorted({e.rule_id for e in verdict.evidence})))
            breached[verdict.key] = said
            if self.guard_reported.get(verdict.key) != said:
                self.report(verdict, now)
        self.guard_reported = (
            breached  # a process back within every policy is reported again on a new breach
        )

    def check_host_findings(self, now: float) -> None:
        """GPU host findings (orphaned memory: logged when it appears, changes materially or goes away,
        and kept for status and metrics; past heavy users: logged once).  Never handed to the responder:
        there is no offender process to stop safely."""
        self.counts["host_checks"] += 1
        ctx, counters = self.ctx, self.ctx.counters
        thresholds = ctx.rules.current.thresholds
        try:
            records = self.host_findings.check(now, thresholds.suspicious, thresholds.malicious)
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
