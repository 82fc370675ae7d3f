"""Host findings about GPU memory and past GPU users: abuse that is not one live process's verdict.

* **orphaned GPU memory**: a device's used memory that no live process accounts
  for (beyond the driver's own reservation: ~500 MiB on an idle H100), or memory
  a zombie or vanished pid still holds — the "stuck GPU memory" on-call case —
  reported with the device, the amount and the likely owner;
* **past heavy GPU users**: NVML accounting records of processes that already
  exited after using a GPU flat out for a long time (the miner that ran last
  night), with their lifetime figures.

Input is what ``gpuguard.sources`` observed (the newest live GPU snapshot, the
driver's pid states, accounting records); the rules are rows of
``host_rules.HOST_RULES`` like the other host checks.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from gpuguard.detect.host.checks import HostFinding
from gpuguard.events.gpu_accounting import GpuAccounting
from gpuguard.events.gpu_snapshot import GpuSnapshot

GIB = 1 << 30
MIB = 1 << 20
ORPHAN_MIN_BYTES = 2 * GIB  # an idle H100 shows ~500 MiB used with no process (driver reservation)
ORPHAN_MIN_FRACTION = 0.05
PAST_USER_MIN_UTIL = 80.0
PAST_USER_MIN_S = 600.0


def _size(n: float) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / MIB:.0f} MiB"


def check_gpu_memory(
    snapshots: Iterable[GpuSnapshot],
    pid_states: dict[int, str],
    accounting: Iterable[GpuAccounting] = (),
) -> list[HostFinding]:
    """Orphaned or dead-held memory on each device of the newest live snapshot of each source."""
    latest: dict[str, GpuSnapshot] = {}
    for snap in snapshots:
        if not any(d.extra.get("history") for d in snap.devices):
            latest[snap.source] = snap
    exited = [r for r in accounting if not r.running]
    findings: list[HostFinding] = []
    for snap in latest.values():
        for device in snap.devices:
            name = f"{device.vendor} gpu{device.index}" + (
                f" ({device.pci_bus_id})" if device.pci_bus_id else ""
            )
            users = [
                p
                for p in snap.processes
                if (p.vendor, p.device_index) == (device.vendor, device.index)
            ]
            dead = [p for p in users if pid_states.get(p.pid) in ("zombie", "gone")]
            for p in dead:
                held = _size(p.used_memory) if p.used_memory else "an unknown amount of"
                findings.append(
                    HostFinding(
                        "host-gpu-memory-orphaned",
                        subject=f"{name} pid {p.pid}",
                        detail=f"{name}: {held} memory held by pid {p.pid}, which is {pid_states[p.pid]}",
                        evidence=[
                            f"driver lists pid {p.pid} on {name} with {held} memory",
                            f"/proc/{p.pid}: {pid_states[p.pid]}",
                        ],
                        pid=p.pid,
                        device=name,
                        amount=p.used_memory,
                    )
                )
            if (
                device.memory_used is None
                or not device.memory_total
                or any(p.used_memory is None for p in users)
            ):
                continue
            unaccounted = device.memory_used - sum(
                p.used_memory or 0 for p in users if p not in dead
            )
            if dead or unaccounted < max(
                ORPHAN_MIN_BYTES, ORPHAN_MIN_FRACTION * device.memory_total
            ):
                continue
            owners = sorted(
                (
                    r
                    for r in exited
                    if r.device_index == device.index
                    and r.max_memory
                    and r.max_memory >= unaccounted / 2
                ),
                key=lambda r: -(r.start_time or 0),
            )
            owner = (
                f"likely owner: exited pid {owners[0].pid} (peak {_size(owners[0].max_memory)})"
                if owners
                else "likely owner: unknown (no accounting record; a process in another pid namespace "
                "the driver does not list, or a leaked context)"
            )
            findings.append(
                HostFinding(
                    "host-gpu-memory-orphaned",
                    subject=name,
                    detail=(
                        f"{name}: {_size(unaccounted)} of {_size(device.memory_total)} in use "
                        f"by no live process; {owner}"
                    ),
                    evidence=[
                        f"device memory used {_size(device.memory_used)}",
                        f"processes account for {_size(device.memory_used - unaccounted)} ({len(users)} listed)",
                        owner,
                    ],
                    pid=owners[0].pid if owners else None,
                    device=name,
                    amount=unaccounted,
                )
            )
    return findings


def check_past_gpu_users(accounting: Iterable[GpuAccounting]) -> list[HostFinding]:
    findings = []
    for r in accounting:
        if r.running or r.gpu_util is None or r.duration_s is None:
            continue
        if r.gpu_util < PAST_USER_MIN_UTIL or r.duration_s < PAST_USER_MIN_S:
            continue
        when = (
            time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(r.start_time))
            if r.start_time
            else "unknown time"
        )
        peak = _size(r.max_memory) if r.max_memory else "unknown"
        memctl = f"{r.mem_util:.0f}%" if r.mem_util is not None else "unknown"
        findings.append(
            HostFinding(
                "host-gpu-past-heavy-user",
                subject=f"{r.vendor} gpu{r.device_index} pid {r.pid}",
                detail=f"exited pid {r.pid} kept {r.vendor} gpu{r.device_index} {r.gpu_util:.0f}% busy for "
                f"{r.duration_s / 60:.0f} min from {when} (peak memory {peak}, memory-controller {memctl})",
                evidence=[
                    f"NVML accounting: gpuUtilization {r.gpu_util:.0f}, memoryUtilization {memctl}, "
                    f"maxMemoryUsage {peak}, time {r.duration_s:.0f} s, isRunning 0"
                ],
                pid=r.pid,
                device=f"{r.vendor} gpu{r.device_index}",
                amount=r.max_memory,
            )
        )
    return findings
