"""Stage 7, emit: the log written out, the state file and the metrics refreshed when due.

The state file's schedule is :mod:`gpuguard.agent.stages.s7_emit.status_writer`'s.

May import: the agent's shared modules and the layers below the agent; never the pipeline.
"""

from __future__ import annotations

from gpuguard.agent.context import AgentContext
from gpuguard.agent.stages.s7_emit.status_writer import StatusWriter


class EmitStage:
    """Once per loop turn: sync the log; write the state file when something changed or due."""

    def __init__(self, ctx: AgentContext) -> None:
        self.ctx = ctx
        self.status = StatusWriter(ctx)
        self.counts = {"log_syncs": 0}

    def sync_log(self) -> None:
        self.ctx.telemetry.sync_log()
        self.counts["log_syncs"] += 1

    def status_due(self, now: float, periodic: bool) -> None:
        """The state file's periodic check (the loop's schedule says when), or a change to say."""
        if periodic or self.ctx.status_soon:
            self.status.write(now)
