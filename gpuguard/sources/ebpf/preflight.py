"""Checks that the eBPF sensor can run here, each failing with one line: cause and fix."""

from __future__ import annotations

import os
from pathlib import Path

from gpuguard.errors import GpuguardError

SETUP_HINT = "bash packaging/setup-host.sh setup"
TRACEFS_DIRS = (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing"))


def require_root() -> None:
    if os.geteuid() != 0:
        raise GpuguardError(
            "the eBPF sensor needs root (CAP_BPF, CAP_PERFMON and CAP_SYS_ADMIN)",
            "run it as root, e.g. sudo gpuguard watch",
        )


def import_bcc():
    """Return the bcc module, or explain how to get it."""
    try:
        import bcc
    except ImportError:
        raise GpuguardError(
            "bcc is not importable from this Python (Debian ships it as python3-bpfcc; "
            "the PyPI package named bcc is unrelated)",
            f"apt-get install python3-bpfcc and use a venv made with --system-site-packages ({SETUP_HINT})",
        ) from None
    if not hasattr(bcc, "BPF"):
        raise GpuguardError(
            f"the 'bcc' module at {getattr(bcc, '__file__', '?')} is not BPF Compiler Collection",
            "pip uninstall bcc, then apt-get install python3-bpfcc",
        )
    return bcc


def require_kernel_headers():
    """The header source bcc will compile against (kernel_headers); raises when there is none."""
    from gpuguard.sources.ebpf.kernel_headers import HEADERS

    return HEADERS.use()


def require_tracefs() -> None:
    for base in TRACEFS_DIRS:
        if (base / "events" / "syscalls").is_dir():
            return
    raise GpuguardError(
        "tracefs is not mounted (syscall tracepoints are not visible)",
        "mount -t tracefs tracefs /sys/kernel/tracing",
    )


def check_sensor_prerequisites():
    """Run every check in order; return the bcc module when all pass."""
    require_root()
    bcc = import_bcc()
    require_kernel_headers()
    require_tracefs()
    return bcc
