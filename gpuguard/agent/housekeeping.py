"""The agent's housekeeping, every few seconds: expiry, CPU samples, blocks, memory, drops.

Old processes expire; the CPU-miner candidates (huge-page users, host tuners, and every
process the FPU probe saw leave round-to-nearest) get CPU windows and runnable-thread
records (the CPU-miner rules read them); the FPU probe is attached only while some thread
hardly sleeps; the responder lifts expired blocks; freed heap goes back to the kernel once
there was work to free it (TRIM_AFTER_ITEMS); the stages forget processes no longer tracked;
drops since the last look are reported as one lifecycle line.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from gpuguard.agent.context import AgentContext
from gpuguard.agent.memory import return_freed_memory
from gpuguard.agent.stages.s4_score import ScoreStage
from gpuguard.agent.stages.s5_report import ReportStage
from gpuguard.agent.stages.s6_act import ActStage
from gpuguard.correlate.correlator import Correlator
from gpuguard.sources.proc.busy import SpinWatch
from gpuguard.sources.proc.cpu_usage import CpuActivitySampler, CpuSampler

if TYPE_CHECKING:
    from gpuguard.sources.ebpf.sensor import Sensor

HOUSEKEEPING_S = 10.0  # expire old processes and report drops this often
# A pass that took this much CPU is heavy (on a busy host: the spin watch's /proc walk, CPU
# samples), one under LIGHT_BELOW_S light again; between the two it stays as it was
HEAVY_FROM_S = 0.001
LIGHT_BELOW_S = 0.0005
# malloc_trim walks the whole heap (~0.5 ms cold): after this many items correlated since the
# last one, or TRIM_EVERY_S; an idle agent frees nothing worth the walk
TRIM_AFTER_ITEMS = 1000
TRIM_EVERY_S = 600.0


class Housekeeping:
    """One housekeeping pass (``run``); the CPU samplers and the drop count it keeps."""

    def __init__(
        self,
        ctx: AgentContext,
        correlator: Correlator,
        sensor: Sensor | None,
        score: ScoreStage,
        report: ReportStage,
        act: ActStage,
    ) -> None:
        self.ctx, self.correlator, self.sensor = ctx, correlator, sensor  # sensor: its FPU probe
        self.score, self.report, self.act = score, report, act
        self.cpu_sampler = CpuSampler(ctx.proc_root)  # CPU windows of huge-page users and tuners
        self.cpu_activity = CpuActivitySampler(ctx.proc_root)  # runnable threads, FPU rounding
        self.spin_watch = SpinWatch(ctx.proc_root)  # when the FPU probe is attached
        self.drops_reported = 0
        self._trimmed = (0, 0.0)  # (items correlated, time) at the last heap trim
        self.heavy = False  # whether the passes cost a few ms (the loop spreads them out)

    def run(self, now: float, period_s: float) -> bool:
        """One pass; whether the passes are heavy: the loop then runs them half a step (5 s)
        off the host checks and the state file, so the two do not add up in one burst."""
        cpu = time.thread_time()
        self._run(now, period_s)
        self.heavy = heavy_pass(time.thread_time() - cpu, self.heavy)
        return self.heavy

    def _run(self, now: float, period_s: float) -> None:
        correlator = self.correlator
        correlator.expire(now)
        # CPU windows for huge-page users and host tuners (the CPU-miner rules read them)
        for key, percent in self.cpu_sampler.sample(correlator.cpu_candidates()).items():
            correlator.add_cpu_sample(key, now, percent)
        self._gate_rounding_probe()
        self._sample_cpu_activity(now)
        self.act.sweep_blocks(now)
        self._trim_heap(now)
        self.report.prune()
        self.score.prune()
        self._report_drops(period_s)

    def _trim_heap(self, now: float) -> None:
        items, at = self._trimmed
        correlated = self.ctx.counters.items_correlated
        if correlated - items >= TRIM_AFTER_ITEMS or now - at >= TRIM_EVERY_S:
            return_freed_memory()
            self._trimmed = (correlated, now)

    def _gate_rounding_probe(self) -> None:
        """The FPU probe runs at context switches only while a thread hardly sleeps, or the
        host has more runnable threads than CPUs (sources.proc.busy): where nothing spins it
        costs the host nothing."""
        probe = self.sensor.fpu if self.sensor is not None else None
        if probe is None or not probe.loaded:
            return
        spinning = self.spin_watch.candidates(ignore=os.getpid())
        attached = probe.set_attached(bool(spinning) or self.spin_watch.contended)
        self.ctx.counters.fpu_probe = {
            "attached": attached,
            "attaches": probe.attaches,
            "attach_failures": probe.attach_failures,
            **self.spin_watch.counts,
        }

    def _sample_cpu_activity(self, now: float) -> None:
        """Runnable threads of the CPU-miner candidates and of every process the FPU probe saw
        leave round-to-nearest, as CpuActivity records (the CPU-miner rules read them)."""
        correlator = self.correlator
        sensor = self.sensor
        fpu_probe = sensor.fpu if sensor is not None else None
        fpu = fpu_probe.counts() if fpu_probe is not None and fpu_probe.loaded else None
        keys = set(correlator.cpu_candidates())
        gone = []
        for pid in fpu or ():
            state = correlator.state_of(pid)
            if state is None or state.exited:
                gone.append(pid)
            else:
                keys.add(state.key)
        if gone and fpu_probe is not None:
            fpu_probe.forget([pid for pid in gone if not os.path.exists(f"/proc/{pid}")])
        targets = {}
        for key in keys:
            state = correlator.get(key)
            if state is not None:
                targets[key] = (key.pid, state.comm)
        for event in self.cpu_activity.sample(targets, now, fpu):
            correlator.feed(event)

    def _report_drops(self, period_s: float) -> None:
        counters = self.ctx.counters
        drops = counters.drops_total()
        if drops > self.drops_reported:
            self.ctx.lifecycle(
                "drops",
                f"{drops - self.drops_reported} events or lines could not be handled "
                f"in the last {period_s:g} s (capacity exceeded)",
                ring_lost=dict(counters.ring_lost),
                intake_dropped=dict(counters.intake_dropped),
                output_dropped=counters.output_dropped,
            )
            self.drops_reported = drops


def heavy_pass(cpu_s: float, was_heavy: bool) -> bool:
    """Whether passes that cost ``cpu_s`` of CPU are heavy (with hysteresis: no flapping)."""
    return cpu_s >= HEAVY_FROM_S or (was_heavy and cpu_s >= LIGHT_BELOW_S)
