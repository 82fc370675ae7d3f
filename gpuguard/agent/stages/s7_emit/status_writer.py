"""When the agent rewrites its state file (:mod:`.status_file`): on change, or as a heartbeat.

An idle agent rewrites nothing but the heartbeat every STATUS_HEARTBEAT intervals (readers
call an older file stale); a change worth saying (a finding, an action, a reload) is written
within the loop turn (``AgentContext.status_soon``).  The periodic check is one of the detect
loop's scheduled tasks (:mod:`.schedule`): a write out of turn does not move it, so it stays
in the same wake-up as the rule-file check.
"""

from __future__ import annotations

import time
from typing import Any

from gpuguard.agent import status_file
from gpuguard.agent.context import AgentContext
from gpuguard.agent.status_file import STATUS_HEARTBEAT
from gpuguard.detect.ruleset.reload import RuleSetHolder

_STATUS_CLOCKS = frozenset(
    (
        "updated",
        "events_per_s",
        "samples",
        "sampler_seconds",
        "scoring_runs",
        "scoring_seconds",
        "items_correlated",  # moves with every GPU sample, as the sample counts do
        "sweeps",
        "sweep_seconds",
        "gpus",  # utilisation and power move with each sample: a new GPU shows at the heartbeat
        "stages",  # each stage's work counts move with the items, as items_correlated does
    )
)


# the FPU probe's spin watch counts its looks (sources.proc.busy.SpinWatch.counts): every
# housekeeping pass moves them, so alone they rewrote an idle agent's state file every 10 s
_SPIN_WATCH_CLOCKS = frozenset(("looks", "process_sweeps", "thread_looks"))


class StatusWriter:
    """The state file's document and its rewrite schedule."""

    def __init__(self, ctx: AgentContext, rules: RuleSetHolder) -> None:
        self.ctx, self.rules = ctx, rules
        self._content: Any = None  # what the state file last said, less its clocks
        self._heartbeat = 0.0
        self._events_at = (time.monotonic(), 0)
        self.events_per_s = 0.0

    def document(self, now: float, running: bool = True) -> dict[str, Any]:
        ctx, counters = self.ctx, self.ctx.counters
        mono = time.monotonic()
        then, events_then = self._events_at
        if mono - then >= 1.0:
            self.events_per_s = (counters.events_total() - events_then) / (mono - then)
            self._events_at = (mono, counters.events_total())
        sources = [str(p) for p in self.rules.current.sources]
        return status_file.status_document(
            counters, ctx.config, sources, self.events_per_s, now, running
        )

    def write(self, now: float, running: bool = True) -> None:
        """Write the state file when what it says changed, or as a heartbeat every
        STATUS_HEARTBEAT intervals (readers call an older file stale): an idle agent rewrites
        nothing but that."""
        ctx, counters = self.ctx, self.ctx.counters
        ctx.status_soon = False
        mono = time.monotonic()
        document = self.document(now, running)
        content = _status_content(document)
        if running and content == self._content and mono < self._heartbeat:
            return
        self._content = content
        self._heartbeat = mono + STATUS_HEARTBEAT * ctx.config.status_interval_s
        try:
            status_file.write_status(ctx.config.status_path, document)
        except OSError as exc:
            counters.status_errors += 1
            if counters.last_status_error != exc.strerror:
                counters.last_status_error = exc.strerror or str(exc)
                ctx.stderr(
                    f"gpuguard: cannot write the state file {ctx.config.status_path}: {exc.strerror}"
                )


def _status_content(document: dict[str, Any]) -> dict[str, Any]:
    """The state file less what moves with the clock alone (its time, rates, sample and
    scoring-pass counts): equal means nothing worth rewriting the file for happened."""
    content = {k: v for k, v in document.items() if k not in _STATUS_CLOCKS}
    counters = content.get("counters")
    if isinstance(counters, dict):
        content["counters"] = {k: v for k, v in counters.items() if k not in _STATUS_CLOCKS}
        fpu = content["counters"].get("fpu_probe")
        if isinstance(fpu, dict):  # the spin watch's looks move with each housekeeping pass
            content["counters"]["fpu_probe"] = {
                k: v for k, v in fpu.items() if k not in _SPIN_WATCH_CLOCKS
            }
    return content
