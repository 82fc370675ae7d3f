"""The live view's lines: GPU opens, ioctl summaries, connections and first bytes sent.

One line per GPU open and huge-page allocation, ioctl summaries per process and
interval, connections and first bytes of GPU-touching processes.

Every process name, path, address and payload detail is escaped: a process
can name itself anything, including terminal escape sequences.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable
from typing import TextIO

from gpuguard.escape import escape_text
from gpuguard.events.model import (
    Connect,
    Event,
    Exec,
    Exit,
    GpuIoctl,
    GpuOpen,
    HugeAlloc,
    Lost,
    NetPayload,
)

MINING_PROTOCOLS = frozenset({"stratum", "cryptonote", "ethproxy", "stratum-v2"})


def _clock(t: float) -> str:
    try:
        return time.strftime("%H:%M:%S", time.localtime(t))
    except (OverflowError, ValueError, OSError):  # a recording may carry any number as a time
        return "??:??:??"


def _who(e: Event) -> str:
    return f"pid {e.pid:<7} {escape_text(e.comm):<15}"


def _detail(detail: dict) -> str:
    parts = []
    for key, value in detail.items():
        if isinstance(value, (list, tuple)):
            value = ",".join(str(v) for v in value)
        elif isinstance(value, dict):
            continue
        parts.append(f"{escape_text(key)}={escape_text(value)}")
    return " ".join(parts)


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.4g} {unit}"
    return f"{n} B"


def format_event(e: Event) -> str:
    """One terminal line for an event (ioctl events are better summarised, see below)."""
    head = f"{_clock(e.time)} {e.kind:<11} {_who(e)}"
    if isinstance(e, GpuOpen):
        rel = " (relative)" if e.relative else ""
        return f"{head} {escape_text(e.path)} [{e.device_class}] fd {e.fd}{rel}"
    if isinstance(e, GpuIoctl):
        return f"{head} {e.device_class} {escape_text(e.command_name)} x{e.count}"
    if isinstance(e, Connect):
        addr = f"[{e.address}]" if e.family == "ipv6" else e.address
        result = (
            "ok" if e.result == 0 else ("in progress" if e.result == -115 else f"error {e.result}")
        )
        return f"{head} {escape_text(addr)}:{e.port} fd {e.fd} {result}"
    if isinstance(e, NetPayload):
        return f"{head} fd {e.fd} #{e.seq} {e.protocol} {_detail(e.detail)}".rstrip()
    if isinstance(e, Exec):
        args = " ".join(escape_text(a) for a in e.cmdline) or escape_text(e.filename)
        return f"{head} {args}"
    if isinstance(e, Exit):
        return f"{head} exit code {e.exit_code}"
    if isinstance(e, HugeAlloc):
        return f"{head} {e.source} {_bytes(e.length)} in {_bytes(e.page_size)} pages"
    if isinstance(e, Lost):
        return f"{_clock(e.time)} {'LOST':<11} {e.count} {escape_text(e.what)} records could not be delivered"
    return f"{head}"


class LiveView:
    """Decides what the live view shows and writes it.

    By default only GPU-touching processes are shown (their opens, ioctl
    summaries, connections, first bytes and exit), plus any connection whose
    first bytes speak a mining protocol, plus every huge-page allocation and every loss.  ``show_all`` shows
    every event.
    """

    def __init__(self, out: TextIO, show_all: bool = False) -> None:
        self.out = out
        self.show_all = show_all
        self.gpu_pids: set[int] = set()

    def write(self, events: Iterable[Event]) -> None:
        ioctls: dict[int, list[GpuIoctl]] = defaultdict(list)
        lines = []
        for e in events:
            if isinstance(e, GpuIoctl):
                self.gpu_pids.add(e.pid)
                ioctls[e.pid].append(e)
                continue
            if isinstance(e, GpuOpen):
                self.gpu_pids.add(e.pid)
            if self._shows(e):
                lines.append(format_event(e))
            if isinstance(e, Exit):
                self.gpu_pids.discard(e.pid)
        for _pid, group in ioctls.items():
            lines.append(self._ioctl_summary(group))
        if lines:
            self.out.write("\n".join(lines) + "\n")
            self.out.flush()

    def _shows(self, e: Event) -> bool:
        if self.show_all or isinstance(e, (GpuOpen, HugeAlloc, Lost)):
            return True
        if isinstance(e, NetPayload) and e.protocol in MINING_PROTOCOLS:
            return True
        return e.pid in self.gpu_pids and not isinstance(e, Exec)

    @staticmethod
    def _ioctl_summary(group: list[GpuIoctl]) -> str:
        first = group[0]
        total = sum(e.count for e in group)
        by_name = sorted(group, key=lambda e: -e.count)
        parts = " ".join(f"{escape_text(e.command_name)}x{e.count}" for e in by_name[:6])
        more = f" +{len(by_name) - 6} more" if len(by_name) > 6 else ""
        return f"{_clock(first.time)} {'ioctls':<11} {_who(first)} {total} total: {parts}{more}"
