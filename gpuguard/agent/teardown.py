"""The agent's teardown: always runs, however far start-up got (:class:`.host.AgentHost`).

Producers stop, what they queued is scored, pending updates and last closes are written, the
responder closes (its later outcomes recorded), a summary line is written (a refused start
writes ``start-failed`` with the reason instead, and nothing after it; a stop during start-up
writes the start record first), the YARA cache is saved,
the probes are detached, the log is flushed, the state file says the agent stopped and the
metrics endpoint closes.  What start-up never opened is skipped.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from gpuguard.agent.counters import AgentCounters
from gpuguard.agent.stages.s1_produce.opening import close_sensor
from gpuguard.agent.startup import start_record
from gpuguard.errors import GpuguardError
from gpuguard.events.agent_events import AgentLifecycle

if TYPE_CHECKING:
    from gpuguard.agent.host import AgentHost, StartRefused

LOG_FLUSH_S = 1.0  # what is queued for the log gets this long before the summary counts it


def summary_line(c: AgentCounters) -> str:
    """The stop summary: what the agent saw and did, and what it lost (the log's records lost
    include those the destination failed to take, not only those the full queue turned away)."""
    return (
        f"agent stopped after {time.time() - c.started:.0f} s: {c.events_total()} events, "
        f"{sum(c.findings.values())} findings, {sum(c.actions.values())} actions, "
        f"drops: ring {sum(c.ring_lost.values())}, intake {sum(c.intake_dropped.values())}, "
        f"log {c.output_dropped + c.output_errors} (queue full {c.output_dropped}, "
        f"not written {c.output_errors})"
    )


def start_failed(refused: StartRefused, c: AgentCounters, mode: str) -> AgentLifecycle:
    """The record of a refused start: the run's first and last, at its start time, with the
    step that failed, the reason and the fix (what the one stderr line says)."""
    error = refused.error
    if isinstance(error, GpuguardError):
        reason, fix = error.cause, error.fix  # the outputs escape and bound them
    else:  # a bug, not a setting: its type and message (the traceback goes to stderr)
        reason, fix = f"{type(error).__name__}: {error}", ""
    return AgentLifecycle(
        time=c.started,
        action="start-failed",
        message=f"agent refused to start ({refused.step}): {reason}",
        detail=dict(
            step=refused.step, reason=reason, fix=fix, mode=mode, pid=os.getpid(), run_id=c.run_id
        ),
    )


def teardown(agent: AgentHost) -> None:
    ctx, opened = agent.ctx, agent.opened
    stages = opened.wired.stages if opened.wired is not None else None
    ctx.stop.set()
    ctx.intake.wake()
    sensor_busy = stages.produce.join() if stages is not None else False
    if stages is not None:
        try:
            stages.produce.final_feed(agent.feed, agent.unfed)
            agent.score_and_report(time.time())
            stages.report.write_lifecycle(time.time(), final=True)  # pending updates, last closes
        except Exception as exc:  # noqa: BLE001 - the summary and cleanup still run
            ctx.stderr(f"gpuguard: final scoring failed: {type(exc).__name__}: {exc}")
        try:
            stages.act.close()  # waits for pending kills; pinned blocks stay (gpuguard blocks)
        except Exception as exc:  # noqa: BLE001 - the summary and cleanup still run
            ctx.stderr(f"gpuguard: closing the responder failed: {type(exc).__name__}: {exc}")
    c = ctx.counters
    if agent.refused is not None and ctx.telemetry.holding:  # the run's first and last record
        ctx.telemetry.release(start_failed(agent.refused, c, ctx.config.mode))
    else:
        if ctx.telemetry.holding:  # a stop during start-up
            ctx.telemetry.release(start_record(agent, interrupted=True))
        _stop_record(agent)
    if stages is not None:
        stages.enrich.save()
    close_sensor(ctx, opened.sensor, sensor_busy)
    ctx.telemetry.close_log()  # writes out what is queued (the stop line included)
    if stages is not None and agent.ready.is_set():
        stages.emit.status.write(time.time(), running=False)
    ctx.telemetry.close_metrics()
    if agent.ready.is_set():  # a failed start-up says only its one error line; the counts are
        ctx.stderr(f"gpuguard: {summary_line(c)}")  # final here (the stop record's own included)


def _stop_record(agent: AgentHost) -> None:
    """The stop record, counting the records written before it."""
    ctx, c = agent.ctx, agent.ctx.counters
    ctx.telemetry.flush_log(LOG_FLUSH_S)  # the counts below include the records just written
    ctx.lifecycle(
        "stop",
        summary_line(c),
        events=c.events_total(),
        findings=sum(c.findings.values()),
        ring_lost=dict(c.ring_lost),
        intake_dropped=dict(c.intake_dropped),
        log_lost=c.output_dropped + c.output_errors,
        log_dropped=c.output_dropped,
        log_errors=c.output_errors,
    )
