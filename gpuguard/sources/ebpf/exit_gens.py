"""The probes' exit generations from user space: the compile flags that size them, and a reader.

The probes keep an exit generation per pid (``exit_gens``; ``gg_exec.exit_gen`` in
probes/gpuguard.h); ``sources.proc.identity`` uses them to prove a pidfd names the
process an event was about.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

PID_MAX_FALLBACK = 4194304  # the kernel's upper bound on 64-bit

EXIT_FORMATS = (
    "/sys/kernel/tracing/events/sched/sched_process_exit/format",
    "/sys/kernel/debug/tracing/events/sched/sched_process_exit/format",
)


def identity_cflags() -> list[str]:
    """The defines the exit-generation probes need on this host: the array size, and whether
    sched_process_exit says when a thread group dies (``group_dead``, Linux 6.16 on)."""
    flags = [f"-DGG_PID_MAX={pid_max()}"]
    for path in EXIT_FORMATS:
        try:
            with open(path) as f:
                if "group_dead" in f.read():
                    flags.append("-DGG_EXIT_GROUP_DEAD")
                break
        except OSError:
            continue
    return flags


def pid_max(path: str = "/proc/sys/kernel/pid_max") -> int:
    """The host's pid_max: the size of the probes' exit-generation arrays."""
    try:
        with open(path) as f:
            return max(1024, min(int(f.read()), PID_MAX_FALLBACK))
    except (OSError, ValueError):
        return PID_MAX_FALLBACK


class ExitGenTable:
    """Reads a probe's ``exit_gens`` array (a bcc table indexed by pid), one raw lookup a pid
    (bcc's ``table[key]`` costs ~25 us through its Python layers; this is one syscall)."""

    def __init__(self, table: Any) -> None:
        from bcc.libbcc import lib

        self._lookup = lib.bpf_lookup_elem
        self._fd = table.map_fd
        self._key = ctypes.c_uint32()
        self._value = ctypes.c_uint32()
        self._lock = threading.Lock()

    def of(self, pid: int) -> int | None:
        with self._lock:
            self._key.value = pid
            if self._lookup(self._fd, ctypes.byref(self._key), ctypes.byref(self._value)) != 0:
                return None
            return self._value.value
