"""Stage 1, produce: the eBPF sensor (or reduced mode), the GPU samplers and the /proc sweeps.

Each producer runs on its own thread and feeds the intake queue
(:mod:`gpuguard.agent.stages.s1_produce.producers`); the loop takes bounded batches.  Feedback to the
sensor (``watch`` and ``interest`` requests from later stages) is an explicit queue the
sensor thread drains before each poll.

May import: the agent's shared modules and the layers below the agent; never a later stage nor
the pipeline.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from gpuguard.agent.context import AgentContext
from gpuguard.agent.feedback import FeedbackQueue
from gpuguard.agent.memory import return_freed_memory
from gpuguard.agent.stages.s1_produce.exec_interest import exec_interest
from gpuguard.agent.stages.s1_produce.producers import (
    SamplerThread,
    SensorThread,
    SweepThread,
    sweep_once,
)
from gpuguard.errors import GpuguardError

BATCH_ITEMS = 2048  # items fed per pass of the loop (a stop waits for at most one batch)
FINAL_FEED_S = 0.5  # at stop, what is queued is fed for this long; the rest is counted as dropped
REDUCED_MODE_BLIND_SPOTS = (
    "processes that start and exit between two /proc sweeps (every {sweep:g} s) are not seen",
    "GPU ioctl counts and rates are not seen (rules on ioctl commands cannot match)",
    "network payloads (stratum logins, pool methods on the wire) are not seen",
    "connections that open and close between sweeps, or live in another network namespace, are not seen",
)


class ProduceStage:
    """Starts the producers; ``take`` hands the loop one batch of queued items."""

    def __init__(
        self, ctx: AgentContext, sampler_openers: dict[str, Callable[[], Any]] | None
    ) -> None:
        self.ctx = ctx
        self.sampler_openers = sampler_openers
        self.sensor: Any = None
        self.threads: list[Any] = []
        self.feedback = FeedbackQueue()  # ("watch" | "interest", pid) for the sensor thread
        self.counts = {"batches": 0, "items": 0}

    # -- start-up ---------------------------------------------------------------------
    def start_sensor(self, ruleset: Any) -> None:
        """The eBPF sensor, or reduced mode (periodic /proc sweeps) with its blind spots said."""
        from gpuguard.sources.ebpf.probe_source import ProbeSettings
        from gpuguard.sources.ebpf.sensor import Sensor

        ctx, counters = self.ctx, self.ctx.counters
        reason = "--sensor proc was asked for"
        if ctx.config.sensor != "proc":
            # The exec filter: plain short-lived execs stay in the kernel (counted per cgroup);
            # the names and directories the rules score at exec go up in full.
            sensor = Sensor(
                ProbeSettings(exec_filter=True),
                drain_interval=0.5,
                fpu=True,
                exec_names=exec_interest(ruleset),
                ignore_tgid=os.getpid(),  # its own reads of the huge-page settings
            )
            try:
                sensor.start()
            except GpuguardError as exc:
                sensor.close()
                if ctx.config.sensor == "ebpf":
                    raise
                reason = f"eBPF sensor unavailable: {exc.one_line()}"
            else:
                self.sensor = sensor
                return_freed_memory()  # compiling left ~25 MB of LLVM heap free but mapped
                counters.sensor_mode = "ebpf"
                counters.probes_attached = _probes_attached(sensor)
                if sensor.fpu is not None and sensor.fpu.blind_spot:
                    counters.blind_spots = [sensor.fpu.blind_spot]
                    ctx.stderr(f"gpuguard: blind spot: {sensor.fpu.blind_spot}")
                return
        counters.sensor_mode = "proc"
        counters.blind_spots = [
            line.format(sweep=ctx.config.sweep_interval_s) for line in REDUCED_MODE_BLIND_SPOTS
        ]
        ctx.lifecycle(
            "degraded",
            f"reduced mode (/proc sweeps every {ctx.config.sweep_interval_s:g} s): {reason}",
            blind_spots=counters.blind_spots,
        )
        for line in counters.blind_spots:
            ctx.stderr(f"gpuguard: reduced mode blind spot: {line}")

    @property
    def exit_generations(self) -> Any:
        return self.sensor.exit_generations if self.sensor is not None else None

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
        for source, opener in self._sampler_openers().items():
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

    def _sampler_openers(self) -> dict[str, Callable[[], Any]]:
        if self.sampler_openers is not None:
            return self.sampler_openers
        from gpuguard.sources.gpu.sampler import SourceUnavailable, open_samplers

        proc_root = self.ctx.proc_root

        def opener(source: str) -> Callable[[], Any]:
            def open_one() -> Any:
                statuses: list[str] = []
                samplers = open_samplers([source], proc_root=proc_root, on_status=statuses.append)
                if not samplers:
                    raise SourceUnavailable(
                        statuses[0] if statuses else f"{source} is not available"
                    )
                return samplers[0]

            return open_one

        return {source: opener(source) for source in self.ctx.config.gpu_sources}

    # -- the loop ---------------------------------------------------------------------
    def take(self, timeout: float, most: int = BATCH_ITEMS) -> list:
        """One bounded batch (under a flood a stop or reload waits for one batch, not the queue)."""
        items = self.ctx.intake.take_all(timeout, most)
        self.ctx.counters.intake_depth = len(self.ctx.intake)
        self.counts["batches"] += 1
        self.counts["items"] += len(items)
        return items

    def set_exec_names(self, ruleset: Any) -> None:
        """A reloaded rule set: the names and directories whose execs go up in full."""
        if self.sensor is not None:
            self.sensor.set_exec_names(*exec_interest(ruleset))

    def request(self, kind: str, pid: int) -> None:
        """Feedback for the sensor (``watch`` or ``interest``); dropped in reduced mode."""
        if self.sensor is not None:
            self.feedback.put((kind, pid))

    # -- stop -------------------------------------------------------------------------
    def join(self) -> bool:
        """Wait for the producer threads; True when the sensor thread is still busy."""
        self._wake_samplers()  # an idle sampler's wait is several seconds
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

    def close_sensor(self, busy: bool) -> None:
        if self.sensor is not None and busy:
            self.ctx.stderr(
                "gpuguard: the sensor thread did not stop; the probes go with the process"
            )
            self.sensor = None
        if self.sensor is not None:
            try:
                self.sensor.close()  # detaches every probe
            except Exception as exc:  # noqa: BLE001 - the summary and cleanup still run
                self.ctx.stderr(
                    f"gpuguard: detaching the probes failed: {type(exc).__name__}: {exc}"
                )
            self.sensor = None


def _probes_attached(sensor: Any) -> int:
    bpf = getattr(sensor, "_bpf", None)
    if bpf is None:
        return 0
    return len(getattr(bpf, "tracepoint_fds", {})) + len(getattr(bpf, "raw_tracepoint_fds", {}))
