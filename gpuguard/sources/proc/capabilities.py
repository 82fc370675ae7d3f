"""The capabilities a process holds, read from its /proc status (``CapEff``), by name."""

from __future__ import annotations

from pathlib import Path

# linux/capability.h numbers of the capabilities gpuguard names
CAPABILITY_BITS = {
    "CAP_DAC_READ_SEARCH": 2,
    "CAP_KILL": 5,
    "CAP_NET_ADMIN": 12,
    "CAP_SYS_PTRACE": 19,
    "CAP_SYS_ADMIN": 21,
    "CAP_SYS_RESOURCE": 24,
    "CAP_PERFMON": 38,
    "CAP_BPF": 39,
}


def effective_capabilities(status: Path = Path("/proc/self/status")) -> set[str]:
    """The named capabilities in this process's effective set."""
    for line in status.read_text().splitlines():
        if line.startswith("CapEff:"):
            bits = int(line.split()[1], 16)
            return {name for name, bit in CAPABILITY_BITS.items() if bits >> bit & 1}
    return set()


def can_load_bpf(have: set[str]) -> bool:
    """Whether ``have`` loads and attaches tracepoint programs: CAP_BPF with CAP_PERFMON (kernel
    5.8+), or CAP_SYS_ADMIN, which grants both (and is what older kernels ask for)."""
    return {"CAP_BPF", "CAP_PERFMON"} <= have or "CAP_SYS_ADMIN" in have
