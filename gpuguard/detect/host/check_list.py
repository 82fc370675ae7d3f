"""The host checks, listed once: what each reads, and whether `scan`, the agent or both run it.

``gpuguard scan`` and the agent (:mod:`gpuguard.agent.stages.s5_report.host_findings`) gather the inputs they
have into :class:`HostInputs` and call :func:`run_host_checks` with their place; a check runs
where it is listed and when every input it reads was gathered.  Adding a host check is its
function (in :mod:`.checks`, :mod:`.gpu_checks` or :mod:`.tuning_checks`), its rule rows
(:mod:`.rules`) and one entry below.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from gpuguard.detect.host import checks as host_checks
from gpuguard.detect.host import gpu_checks as gpu_host_checks
from gpuguard.detect.host import tuning_checks as tuning_host_checks
from gpuguard.detect.host.checks import HostFinding

SCAN, AGENT = "scan", "agent"


@dataclass(slots=True)
class HostInputs:
    """What the host checks read; None: not gathered by this caller (checks reading it skip)."""

    autostart_files: Iterable[Any] | None = None  # sources.host.persistence.AutostartFile
    vocabulary: host_checks.MinerVocabulary | None = None
    ld_so_preload: str | None = None  # its content; "" when absent
    gpu_stack: Any | None = None  # sources.host.gpu_stack.GpuStackFacts
    hidden_pids: Iterable[Any] | None = None  # sources.proc.hidden_pids.HiddenPid
    snapshots: list[Any] | None = None  # events.gpu_snapshot.GpuSnapshot
    pid_states: dict[int, str] | None = None  # the GPU holders' /proc states
    accounting: list[Any] | None = None  # events.gpu_accounting.GpuAccounting
    tuning_root: str | None = None  # where /sys and /proc are read for host tuning


@dataclass(frozen=True, slots=True)
class HostCheck:
    name: str
    rules: tuple[str, ...]  # the host rules (host_rules.HOST_RULES) it can fire
    reads: tuple[str, ...]  # HostInputs fields
    runs_in: frozenset[str]  # SCAN, AGENT
    why: str  # why it runs there (and not elsewhere)
    run: Callable[[HostInputs], list[HostFinding]]


_SCAN_ONLY, _BOTH = frozenset({SCAN}), frozenset({SCAN, AGENT})

HOST_CHECKS: tuple[HostCheck, ...] = (
    HostCheck(
        "autostart",
        ("host-persistence-miner",),
        ("autostart_files", "vocabulary"),
        _SCAN_ONLY,
        "files at rest, read once per audit; the agent sees a persisted miner when it starts",
        lambda i: host_checks.check_autostart_files(i.autostart_files, i.vocabulary),
    ),
    HostCheck(
        "ld-so-preload",
        ("host-ld-so-preload",),
        ("ld_so_preload",),
        _SCAN_ONLY,
        "a file at rest, read once per audit; the agent does not re-read it",
        lambda i: host_checks.check_ld_so_preload(i.ld_so_preload),
    ),
    HostCheck(
        "device-nodes",
        ("host-raw-memory-node-exposed", "host-gpu-node-world-writable"),
        ("gpu_stack",),
        _SCAN_ONLY,
        "node permissions are configuration: the GPU stack is read once per audit",
        lambda i: host_checks.check_device_nodes(i.gpu_stack.device_nodes),
    ),
    HostCheck(
        "kernel",
        (
            "host-kernel-forced-module",
            "host-untrusted-kernel-module",
            "host-gpu-driver-mismatch",
        ),
        ("gpu_stack",),
        _SCAN_ONLY,
        "kernel taint, modules and driver versions: the GPU stack is read once per audit",
        lambda i: host_checks.check_kernel(i.gpu_stack),
    ),
    HostCheck(
        "hidden-pids",
        ("host-hidden-process",),
        ("hidden_pids",),
        _SCAN_ONLY,
        "probes every pid against a /proc listing; the agent's sensor sees execs /proc hides",
        lambda i: host_checks.check_hidden_pids(i.hidden_pids),
    ),
    HostCheck(
        "gpu-memory",
        ("host-gpu-memory-orphaned",),
        ("snapshots", "pid_states", "accounting"),
        _BOTH,
        "GPU samples: scan's one look, the agent's own each sampling.host_check_interval_s",
        lambda i: gpu_host_checks.check_gpu_memory(i.snapshots, i.pid_states, i.accounting),
    ),
    HostCheck(
        "gpu-past-users",
        ("host-gpu-past-heavy-user",),
        ("accounting",),
        _BOTH,
        "NVML accounting, which the samplers read at the host-check interval",
        lambda i: gpu_host_checks.check_past_gpu_users(i.accounting),
    ),
    HostCheck(
        "host-tuning",
        ("host-msr-writes-enabled", "host-hugepages-reserved"),
        ("tuning_root",),
        _BOTH,
        "a few /sys and /proc reads: cheap enough for the agent's interval",
        lambda i: tuning_host_checks.host_tuning_findings(i.tuning_root),
    ),
)


def run_host_checks(where: str, inputs: HostInputs) -> list[HostFinding]:
    """The findings of the checks listed for ``where`` (SCAN, AGENT) whose inputs were gathered."""
    found: list[HostFinding] = []
    for check in HOST_CHECKS:
        if where in check.runs_in and all(getattr(inputs, n) is not None for n in check.reads):
            found += check.run(inputs)
    return found
