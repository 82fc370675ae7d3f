"""Host findings about CPU-miner host tuning: MSR writes enabled and huge pages reserved.

RandomX miners running as root load the msr module with writes allowed
(``modprobe msr allow_writes=on``: a load-time parameter, so no file write the
sensor could see) and reserve huge pages, 1 GiB ones when they can.  Both stay
after the miner is killed, so they are host state, read by
``gpuguard.sources.proc.huge_pages.read_host_tuning``.  Huge pages alone are ordinary
(databases, DPDK, JVMs, VMs reserve them): that finding is informational, far
below ``suspicious``; MSR writes switched on is a miner's habit on a host that
runs no undervolting or tuning tool, and reaches ``suspicious`` on its own.

The rules are rows of ``host_rules.HOST_RULES`` like the other host checks.
:func:`host_tuning_findings` is the one call for ``scan`` and the agent.
"""

from __future__ import annotations

from gpuguard.detect.host.checks import HostFinding
from gpuguard.sources.proc.huge_pages import MSR_ALLOW_WRITES, HostTuning, read_host_tuning

GIB = 1 << 30
MIB = 1 << 20


def _size(n: int) -> str:
    return f"{n // GIB} GiB" if n >= GIB and n % GIB == 0 else f"{n // MIB} MiB"


def check_host_tuning(tuning: HostTuning) -> list[HostFinding]:
    findings: list[HostFinding] = []
    if tuning.msr_allow_writes is not None and tuning.msr_allow_writes.lower() in (
        "on",
        "1",
        "y",
        "yes",
    ):
        findings.append(
            HostFinding(
                "host-msr-writes-enabled",
                subject=MSR_ALLOW_WRITES,
                detail=f"the msr module allows MSR writes ({MSR_ALLOW_WRITES} = {tuning.msr_allow_writes})",
                evidence=[f"{MSR_ALLOW_WRITES} = {tuning.msr_allow_writes}"],
            )
        )
    if tuning.reserved:
        sizes = ", ".join(
            f"{count} x {_size(size)}" for size, count in sorted(tuning.reserved.items())
        )
        total = sum(size * count for size, count in tuning.reserved.items())
        findings.append(
            HostFinding(
                "host-hugepages-reserved",
                subject="huge pages",
                amount=total,
                detail=f"{sizes} huge pages reserved ({_size(total)} in all)"
                + (
                    "; 1 GiB pages, as RandomX's 1gb-pages mode asks for"
                    if (1 << 30) in tuning.reserved
                    else ""
                ),
                evidence=[
                    f"{path} = {value}"
                    for path, value in sorted(tuning.sources.items())
                    if path != MSR_ALLOW_WRITES
                ],
            )
        )
    return findings


def host_tuning_findings(root: str = "/") -> list[HostFinding]:
    """Read the host's msr and huge-page state under ``root`` and judge it (scan and agent)."""
    return check_host_tuning(read_host_tuning(root))
