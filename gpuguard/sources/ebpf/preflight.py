"""Checks that the eBPF sensor can run here, each failing with one line: cause and fix."""

from __future__ import annotations

from pathlib import Path

from gpuguard.errors import GpuguardError
from gpuguard.sources.proc.capabilities import can_load_bpf, effective_capabilities

SETUP_HINT = "bash packaging/setup-host.sh setup"
TRACEFS_DIRS = (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing"))


def require_bpf_capabilities(have: set[str] | None = None) -> None:
    """The capabilities that load the probes, whoever holds them: root without them fails, a
    user granted them (setpriv, AmbientCapabilities=) passes."""
    have = effective_capabilities() if have is None else have
    if can_load_bpf(have):
        return
    raise GpuguardError(
        "the eBPF sensor needs CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN), and this process "
        f"holds {' '.join(sorted(have & {'CAP_BPF', 'CAP_PERFMON', 'CAP_SYS_ADMIN'})) or 'none of them'}",
        "run it as root, e.g. sudo gpuguard watch, or grant those capabilities "
        '(docs/deploy.md, "Capabilities")',
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


def require_tracefs() -> Path:
    """Where tracefs is mounted (its syscall events visible), or one line saying why not."""
    for base in TRACEFS_DIRS:
        try:
            if (base / "events" / "syscalls").is_dir():
                return base
        except PermissionError:  # tracefs is root's 0700: a user needs CAP_DAC_READ_SEARCH
            raise GpuguardError(
                f"tracefs at {base} is not readable by this process (the probes attach through it)",
                "run it as root, or grant CAP_DAC_READ_SEARCH with the probes' capabilities "
                '(docs/deploy.md, "Capabilities")',
            ) from None
    raise GpuguardError(
        "tracefs is not mounted (syscall tracepoints are not visible)",
        "mount -t tracefs tracefs /sys/kernel/tracing",
    )


def check_sensor_prerequisites():
    """Run every check in order; return the bcc module when all pass."""
    require_bpf_capabilities()
    bcc = import_bcc()
    require_kernel_headers()
    require_tracefs()
    return bcc
