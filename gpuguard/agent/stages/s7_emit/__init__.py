"""Stage 7, emit: the log written out, the state file and the metrics refreshed when due.

The state file's schedule is :mod:`.status_writer`'s.

May import: the agent's shared modules (context, status_file) and the layers below the agent;
never the pipeline.
"""

from __future__ import annotations

from gpuguard.agent.context import AgentContext
from gpuguard.agent.stages.s7_emit.status_writer import StatusWriter
from gpuguard.detect.ruleset.reload import RuleSetHolder


class EmitStage:
    """Once per loop turn: sync the log (and the metrics for a scrape); write the state file when
    something changed or due."""

    def __init__(self, ctx: AgentContext, rules: RuleSetHolder) -> None:
        self.ctx = ctx
        self.status = StatusWriter(ctx, rules)

    def sync_log(self) -> None:
        """The log writer's counts (every turn), and the metrics' totals when a scrape asked."""
        self.ctx.telemetry.sync_log()
        self.ctx.telemetry.sync_metrics_if_wanted()

    def status_due(self, now: float, periodic: bool) -> None:
        """The state file's periodic check (the loop's schedule says when), or a change to say."""
        if periodic or self.ctx.status_soon:
            self.status.write(now)
