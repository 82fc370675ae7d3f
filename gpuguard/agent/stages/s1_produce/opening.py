"""What the produce stage reads from, opened at start-up: the eBPF sensor (or reduced mode), GPUs.

The sensor is started by a start-up step, before the stages are built, and closed by the
teardown once its thread stopped; the GPU sources are opened by their own sampler threads.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpuguard.agent.context import AgentContext
from gpuguard.agent.memory import return_freed_memory
from gpuguard.agent.stages.s1_produce.exec_interest import exec_interest
from gpuguard.errors import GpuguardError

if TYPE_CHECKING:
    from gpuguard.detect.ruleset.load import RuleSet
    from gpuguard.sources.ebpf.sensor import Sensor

REDUCED_MODE_BLIND_SPOTS = (
    "processes that start and exit between two /proc sweeps (every {sweep:g} s) are not seen",
    "GPU ioctl counts and rates are not seen (rules on ioctl commands cannot match)",
    "network payloads (stratum logins, pool methods on the wire) are not seen",
    "connections that open and close between sweeps, or live in another network namespace, are not seen",
)


def start_sensor(ctx: AgentContext, ruleset: RuleSet) -> Sensor | None:
    """The eBPF sensor, or None for reduced mode (periodic /proc sweeps) with its blind spots
    said; ``--sensor ebpf`` makes a sensor that cannot start an error."""
    from gpuguard.sources.ebpf.probe_source import ProbeSettings
    from gpuguard.sources.ebpf.sensor import Sensor

    counters = ctx.counters
    reason = "--sensor proc was asked for"
    if ctx.config.sensor != "proc":
        # The exec filter: plain short-lived execs stay in the kernel (counted per cgroup);
        # the program names the rules score at exec go up in full.
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
            return_freed_memory()  # compiling left ~25 MB of LLVM heap free but mapped
            counters.sensor_mode = "ebpf"
            counters.probes_attached = _probes_attached(sensor)
            if sensor.headers is not None:
                counters.headers, counters.headers_why = sensor.headers.kind, sensor.headers.line()
            if sensor.fpu is not None and sensor.fpu.blind_spot:
                counters.blind_spots = [sensor.fpu.blind_spot]
                ctx.stderr(f"gpuguard: blind spot: {sensor.fpu.blind_spot}")
            return sensor
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
    return None


def close_sensor(ctx: AgentContext, sensor: Sensor | None, busy: bool) -> None:
    """Detach the probes; a sensor whose thread is still in its buffers is left to the exit
    (freeing a ring while a drain reads it would crash the agent)."""
    if sensor is None:
        return
    if busy:
        ctx.stderr("gpuguard: the sensor thread did not stop; the probes go with the process")
        return
    try:
        sensor.close()  # detaches every probe
    except Exception as exc:  # noqa: BLE001 - the summary and cleanup still run
        ctx.stderr(f"gpuguard: detaching the probes failed: {type(exc).__name__}: {exc}")


def gpu_openers(sources: list[str], proc_root: str) -> dict[str, Callable[[], Any]]:
    """One opener per configured GPU source (``registry.open_source``: it raises
    ``SourceUnavailable`` with the source's status line, and whether the host has no GPU it
    reads, when it cannot work here)."""
    from gpuguard.sources.gpu.registry import open_source

    return {source: functools.partial(open_source, source, proc_root) for source in sources}


def _probes_attached(sensor: Any) -> int:
    bpf = getattr(sensor, "_bpf", None)
    if bpf is None:
        return 0
    return len(getattr(bpf, "tracepoint_fds", {})) + len(getattr(bpf, "raw_tracepoint_fds", {}))
