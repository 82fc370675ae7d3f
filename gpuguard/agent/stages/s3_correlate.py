"""Stage 3, correlate: every queued item routed to one process's state (the correlator's).

The correlator owns its states: the score stage reads them and hands the engine's result back
through ``Correlator.apply_scoring``.  One malformed item is reported and skipped, never fatal.
Each item is also shown to the telemetry (per-pod counts) and, for GPU snapshots and
accounting records, to the GPU host checks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuguard.agent.context import AgentContext
from gpuguard.agent.stages.s2_enrich import EnrichStage
from gpuguard.correlate.correlator import Correlator
from gpuguard.correlate.state import ProcessKey
from gpuguard.sources.proc.identity import ExitGenerations, first_sight, raise_fd_limit

FEED_CHECK_ITEMS = 32  # a batch looks for a stop or reload this often (an exec sent up costs ~1 ms)


def live_correlator(
    ctx: AgentContext, enrich: EnrichStage, exit_generations: ExitGenerations | None
) -> Correlator:
    """The agent's correlator: the enrich stage is its /proc reader (facts with their config
    files, read before the batch) and its enrichment (YARA, exe hash); a process seen at its
    exec is held by a pidfd (``exit_generations``: the sensor's; none in reduced mode)."""
    if exit_generations is not None:
        raise_fd_limit()  # a pidfd is held per tracked process (at most max_processes)
    return Correlator(
        facts_provider=enrich.facts_of,
        on_new_facts=enrich.on_new_facts,
        max_processes=ctx.config.max_processes,
        proc_root=ctx.proc_root,
        identify=first_sight(exit_generations),
    )


class CorrelateStage:
    """The correlator and the feeding of batches into it."""

    def __init__(
        self,
        ctx: AgentContext,
        correlator: Correlator,
        keep: Callable[[Any], None],
        host_inputs: tuple,
    ) -> None:
        self.ctx = ctx
        self.correlator = correlator
        self.keep, self.host_inputs = keep, host_inputs  # the GPU host checks' inputs
        self.counts = {"faults": 0}  # items that could not be correlated (each also logged)

    def known(self, pid: int, start_time: float) -> bool:
        return self.correlator.get(ProcessKey(pid, start_time)) is not None

    def comm_of(self, pid: int) -> str | None:
        state = self.correlator.state_of(pid)
        return state.comm if state is not None else None

    def feed(self, items: list, enrich: EnrichStage, cut: Callable[[], bool] | None = None) -> list:
        """Enrich then correlate ``items``, FEED_CHECK_ITEMS at a time, asking ``cut()`` between
        chunks (a batch of execs sent up takes seconds under a flood); returns what is left."""
        for start in range(0, len(items), FEED_CHECK_ITEMS):
            if start and cut is not None and cut():
                return items[start:]
            chunk = items[start : start + FEED_CHECK_ITEMS]
            with enrich.batch(chunk, self.correlator):
                self._correlate(chunk)
        return []

    def _correlate(self, items: list) -> None:
        """Correlate ``items``; ``keep`` gets the GPU snapshots and accounting records too."""
        feed, keep, host_inputs = self.correlator.feed, self.keep, self.host_inputs
        observe = self.ctx.telemetry.observe_item
        comm_of = self.comm_of
        for item in items:
            try:
                feed(item)
            except Exception as exc:  # noqa: BLE001 - one malformed item must not stop detection
                self.counts["faults"] += 1
                self.ctx.lifecycle(
                    "fault",
                    f"could not correlate a {type(item).__name__}: {type(exc).__name__}: {exc}",
                )
            observe(item, comm_of)  # after feed: the correlator names the pids
            if (
                type(item) in host_inputs
            ):  # GPU snapshots and accounting only: sensor events pass by cheaply
                keep(item)
        self.ctx.counters.items_correlated += len(items)
