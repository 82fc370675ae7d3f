"""Stage 1, produce: the eBPF sensor (or reduced mode), the GPU samplers and the /proc sweeps.

Each producer runs on its own thread and feeds the intake queue (:mod:`.producers`); the loop
takes bounded batches.  The sensor is opened by a start-up step (:mod:`.opening`) and handed
in; feedback to it (``watch`` and ``interest`` requests from later stages) is an explicit
queue the sensor thread drains before each poll.

May import: the agent's shared modules (context, feedback, intake, memory, counters) and the
layers below the agent; never a later stage nor the pipeline.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpuguard.agent.context import AgentContext
from gpuguard.agent.feedback import FeedbackQueue
from gpuguard.agent.stages.s1_produce.exec_interest import exec_interest
from gpuguard.agent.stages.s1_produce.producers import (
    SamplerThread,
    SensorThread,
    SweepThread,
    sweep_once,
)

if TYPE_CHECKING:
    from gpuguard.sources.ebpf.sensor import Sensor

BATCH_ITEMS = 2048  # items fed per pass of the loop (a stop waits for at most one batch)
FINAL_FEED_S = 0.5  # at stop, what is queued is fed for this long; the rest is counted as dropped


class ProduceStage:
    """Starts the producers; ``take`` hands the loop one batch of queued items."""

    def __init__(
        self,
        ctx: AgentContext,
        sensor: Sensor | None,
        sampler_openers: dict[str, Callable[[], Any]],
    ) -> None:
        self.ctx = ctx
        self.sensor = sensor  # None: reduced mode (periodic /proc sweeps)
        self.sampler_openers = sampler_openers  # one per GPU source
        self.threads: list[Any] = []
        self.feedback = FeedbackQueue()  # ("watch" | "interest", pid) for the sensor thread

    # -- start-up ---------------------------------------------------------------------
    def seed(self, known: Callable[[int, float], bool]) -> list:
        """One /proc sweep before the loop: a miner that started before the agent is scored at once."""
        return sweep_once(self.ctx.counters, known, self.ctx.proc_root)

    def start_threads(self, known: Callable[[int, float], bool]) -> None:
        ctx, config = self.ctx, self.ctx.config
        if self.sensor is not None:
            self.threads.append(
                SensorThread(
                    self.sensor,
                    ctx.intake,
                    ctx.counters,
                    ctx.stop,
                    ctx.emit,
                    self.feedback,
                    on_gpu_open=self._nudge_samplers,
                    stall_s=ctx.config.health_stall_s,
                )
            )
        else:
            self.threads.append(
                SweepThread(
                    ctx.intake,
                    ctx.counters,
                    ctx.stop,
                    ctx.emit,
                    known,
                    config.sweep_interval_s,
                    ctx.proc_root,
                )
            )
        for source, opener in self.sampler_openers.items():
            self.threads.append(
                SamplerThread(
                    source,
                    opener,
                    ctx.intake,
                    ctx.counters,
                    ctx.stop,
                    ctx.emit,
                    interval=config.sample_interval_s,
                    accounting_interval=config.host_check_interval_s,
                    turn_accounting_on=config.nvml_accounting,
                )
            )
        for thread in self.threads:
            thread.start()

    # -- the loop ---------------------------------------------------------------------
    def take(self, timeout: float, most: int = BATCH_ITEMS) -> list:
        """One bounded batch (under a flood a stop or reload waits for one batch, not the queue)."""
        items = self.ctx.intake.take_all(timeout, most)
        self.ctx.counters.intake_depth = len(self.ctx.intake)
        return items

    def set_exec_names(self, ruleset: Any) -> None:
        """A reloaded rule set: the program names whose execs go up in full."""
        if self.sensor is not None:
            self.sensor.set_exec_names(exec_interest(ruleset))

    def request(self, kind: str, pid: int) -> None:
        """Feedback for the sensor (``watch`` or ``interest``); dropped in reduced mode."""
        if self.sensor is not None:
            self.feedback.put((kind, pid))
            self.sensor.wake()  # its thread takes the feedback before its next wait

    # -- stop -------------------------------------------------------------------------
    def join(self) -> bool:
        """Wait for the producer threads; True when the sensor thread is still busy."""
        self.stop_reading()  # an idle sensor's and sampler's waits are several seconds
        for thread in self.threads:
            thread.join(timeout=10)
        # The sensor's buffers are freed by its close: never while its thread may still be in
        # them (a loaded host can slow the final drain past 10 s; a freed ring would crash it).
        busy = any(t.is_alive() for t in self.threads if isinstance(t, SensorThread))
        if busy:
            for thread in self.threads:
                thread.join(timeout=30)
            busy = any(t.is_alive() for t in self.threads if isinstance(t, SensorThread))
        return busy

    def final_feed(self, feed: Callable[[list, Callable[[], bool]], list], unfed: list) -> None:
        """At stop: the cut-short batch, then what is queued, fed for at most FINAL_FEED_S; the
        rest is dropped and counted (never silent)."""
        intake = self.ctx.intake
        deadline = time.monotonic() + FINAL_FEED_S
        past = lambda: time.monotonic() >= deadline  # noqa: E731 - a one-line stop test
        left = feed(unfed, past)
        while not left and not past():
            items = intake.take_all(0, BATCH_ITEMS)
            if not items:
                return
            left = feed(items, past)
        dropped = len(left) + len(intake.take_all(0))
        if dropped:
            self.ctx.counters.intake_dropped["shutdown"] += dropped

    def stop_reading(self) -> None:
        """Tell the sensor to end its read of the ring now (a flood's whole ring takes seconds),
        and the GPU samplers to end their wait."""
        stop_reading = getattr(self.sensor, "request_stop", None)
        if stop_reading is not None:
            stop_reading()
        self._wake_samplers()

    def _samplers(self) -> list[SamplerThread]:
        return [t for t in self.threads if isinstance(t, SamplerThread)]

    def _nudge_samplers(self) -> None:
        for sampler in self._samplers():
            sampler.nudge()

    def _wake_samplers(self) -> None:
        for sampler in self._samplers():
            sampler.wake.set()
