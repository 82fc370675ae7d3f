"""The probe C text bcc compiles, and the defines that configure it.

bcc rewrites map operations and generates tracepoint argument structs only in
its main file, so the probe parts under ``probes/`` are inlined here into one
text (local ``#include "..."`` lines only).  ``--print-probes`` shows exactly
this text and these flags.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from gpuguard.events.abi import probe_dir
from gpuguard.sources.ebpf.exit_gens import identity_cflags

ENTRY = "sensor.bpf.c"
_LOCAL_INCLUDE = re.compile(r'^\s*#include\s+"([^"]+)"\s*$')


@dataclass(frozen=True, slots=True)
class ProbeSettings:
    payload_capture: bool = True
    perf_buffer: bool = False
    payload_writes: int = 4
    ringbuf_pages: int = 1024  # 4 MiB with 4 KiB pages; must be a power of two
    max_tracked_fds: int = 65536
    max_ioctl_keys: int = 65536
    max_fresh_sockets: int = 16384
    fd_slots: int = 32768  # prefilter slots per map; must be a power of two
    activity_slots: int = 8192  # conn_activity records (watched connections); a power of two
    # How syscall entries are hooked: "tracepoint" (one syscalls:sys_enter_*
    # tracepoint per hooked syscall) or "raw" (one raw sys_enter program for
    # all: cheaper per hooked call, dearer for every other syscall on the
    # host; see benchmarks/README-sensor.md).
    enter_hook: str = "tracepoint"
    pid_max: int = 0  # size of the exit-generation array; 0: the host's pid_max
    # The exec filter (the agent): plain execs are kept in the kernel and counted per cgroup, and
    # go up only for processes that matter or live (see "exec filter" in probes/maps.bpf.h).
    exec_filter: bool = False
    exec_pending: int = 16384  # execs kept in the kernel at once; more go up in full

    def cflags(self) -> list[str]:
        if self.ringbuf_pages & (self.ringbuf_pages - 1):
            raise ValueError("ringbuf_pages must be a power of two")
        if self.fd_slots < 1 or self.fd_slots & (self.fd_slots - 1):
            raise ValueError("fd_slots must be a power of two")
        if self.activity_slots < 2 or self.activity_slots & (self.activity_slots - 1):
            raise ValueError("activity_slots must be a power of two")
        if self.enter_hook not in ("tracepoint", "raw"):
            raise ValueError('enter_hook must be "tracepoint" or "raw"')
        identity = identity_cflags()  # the exit-generation array's size, group_dead
        if self.pid_max:
            identity[0] = f"-DGG_PID_MAX={int(self.pid_max)}"
        flags = [
            f"-DGG_PAYLOAD_WRITES={int(self.payload_writes)}",
            f"-DGG_RINGBUF_PAGES={int(self.ringbuf_pages)}",
            f"-DGG_MAX_TRACKED_FDS={int(self.max_tracked_fds)}",
            f"-DGG_MAX_IOCTL_KEYS={int(self.max_ioctl_keys)}",
            f"-DGG_MAX_FRESH_SOCKETS={int(self.max_fresh_sockets)}",
            f"-DGG_FD_SLOTS={int(self.fd_slots)}",
            f"-DGG_ACTIVITY_SLOTS={int(self.activity_slots)}",
            *identity,
        ]
        if self.enter_hook == "raw":
            flags.append("-DGG_RAW_SYS_ENTER")
        if self.payload_capture:
            flags.append("-DGG_PAYLOAD_CAPTURE")
        if self.perf_buffer:
            flags.append("-DGG_PERF_BUFFER")
        if self.exec_filter:
            flags += ["-DGG_EXEC_FILTER", f"-DGG_EXEC_PENDING={int(self.exec_pending)}"]
        return flags


def _inline(path: Path, seen: set[Path]) -> str:
    out = []
    for line in path.read_text().splitlines(keepends=True):
        match = _LOCAL_INCLUDE.match(line)
        if not match:
            out.append(line)
            continue
        target = (path.parent / match.group(1)).resolve()
        if target in seen:
            continue
        seen.add(target)
        out.append(f"/* ---- begin {match.group(1)} ---- */\n")
        out.append(_inline(target, seen))
        out.append(f"/* ---- end {match.group(1)} ---- */\n")
    return "".join(out)


def probe_text(entry: str = ENTRY) -> str:
    """The single C text handed to bcc for ``probes/<entry>``."""
    return _inline(probe_dir() / entry, set())


def print_probes(settings: ProbeSettings) -> str:
    return f"/* bcc cflags: {' '.join(settings.cflags())} */\n" + probe_text()
