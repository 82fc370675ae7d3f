"""Per-connection activity of watched processes: the kernel's records, read on an interval.

The kernel's maps are reached only through the :class:`ActivityRecords` the reader is given
(``gpuguard.sources.ebpf.activity_map``).  Details: docs/internals.md, "conn_activity".
"""

from __future__ import annotations

import os
import time
from typing import Any, Protocol

from gpuguard.events.model import ConnActivity
from gpuguard.sources.net.tcp_sessions import (
    TCP_PROTOCOLS,
    TcpSession,
    TcpSessionReader,
    socket_fds,
)

ACTIVITY_TIMES = 8
INTERVAL_S = 10.0


class ActivityRecords(Protocol):
    """What the reader asks of the kernel's activity records and watch list."""

    epoch_offset: float  # seconds to add to a record's boot-clock times

    def watch(self, tgid: int) -> None: ...
    def unwatch(self, tgid: int) -> None: ...
    def watched(self) -> list[int]: ...
    def nobody_watched(self) -> bool: ...
    def records(self) -> list[tuple[tuple[int, int], Any]]: ...  # ((tgid, fd), record)
    def seed(self, tgid: int, fd: int, start_ns: int) -> bool: ...
    def free(self, tgid: int, fd: int) -> None: ...


class ConnActivityReader:
    """Reads ``conn_activity`` and maintains ``watched_tgids`` (see the module docstring)."""

    def __init__(self, kernel: ActivityRecords, interval_s: float = INTERVAL_S) -> None:
        self._kernel = kernel
        self._unswept = False  # a forget left slots for the sweep to read
        self.interval_s = interval_s
        self._offset = kernel.epoch_offset
        self._reported: dict[
            tuple[int, int], tuple
        ] = {}  # key -> (writes, small writes, bytes/segs in) last reported
        self.tcp = TcpSessionReader()  # the stack's counters of the recorded connections
        self.unreadable: list[
            str
        ] = []  # the latest report's namespaces whose TCP counters could not be read
        self._seeded: set[tuple[int, int]] = set()
        self.watched_by_user: set[int] = set()
        self._next = 0.0

    # -- watching ----------------------------------------------------------------
    def watch(self, tgid: int) -> int:
        """Watch a process's connections from now on, including those it already has; returns how many were seeded."""
        self._kernel.watch(tgid)
        self.watched_by_user.add(tgid)
        return self._seed(tgid)

    def _seed(self, tgid: int) -> int:
        # the process's own TCP sockets first: most hold none, and the namespace's TCP tables
        # (every socket of every process in it, TIME_WAIT included) cost ms on a busy host
        sockets = socket_fds(tgid, protocols=TCP_PROTOCOLS)
        if not sockets:
            return 0
        inodes = established_socket_inodes(tgid)
        if not inodes:
            return 0
        now_ns = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        seeded = 0
        for inode, fd in sockets.items():
            if inode not in inodes or not self._kernel.seed(tgid, fd, now_ns):
                continue
            self._seeded.add((tgid, fd))
            seeded += 1
        return seeded

    # -- reporting ---------------------------------------------------------------
    def due(self, now: float) -> bool:
        return now >= self._next

    @property
    def next_due(self) -> float:
        """The monotonic time of the next report."""
        return self._next

    def report(self, header_of) -> list[ConnActivity]:
        """One event per record that changed since the last report; ``header_of(tgid)`` gives
        (comm, uid, gid, cgroup_id)."""
        self._next = time.monotonic() + self.interval_s
        if not self._reported and self._kernel.nobody_watched():
            return []  # nothing watched, nothing said before: skip reading every slot (idle)
        now_boot = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        out: list[ConnActivity] = []
        records = self._kernel.records()
        stack = self.tcp.read({ident[0] for ident, _ in records}) if records else None
        self.unreadable = stack.unreadable if stack else []
        for ident, leaf in records:
            tgid, fd = ident
            tcp = stack.sessions.get(ident) if stack else None
            state = (
                leaf.writes_out,
                leaf.small_writes,
                tcp and tcp.bytes_received,
                tcp and tcp.data_segs_in,
            )
            if self._reported.get(ident) == state:
                continue
            self._reported[ident] = state
            n = min(leaf.small_writes, ACTIVITY_TIMES)
            ring = [leaf.small_ns[(leaf.small_writes - n + i) % ACTIVITY_TIMES] for i in range(n)]
            comm, uid, gid, cgroup_id = header_of(tgid)
            out.append(
                ConnActivity(
                    time=now_boot / 1e9 + self._offset,
                    pid=tgid,
                    uid=uid,
                    gid=gid,
                    cgroup_id=cgroup_id,
                    comm=comm,
                    fd=fd,
                    age_s=round((now_boot - leaf.start_ns) / 1e9, 3),
                    bytes_out=leaf.bytes_out,
                    writes_out=leaf.writes_out,
                    small_writes=leaf.small_writes,
                    small_write_times=[round(t / 1e9 + self._offset, 6) for t in ring if t],
                    idle_s=round((now_boot - leaf.last_ns) / 1e9, 3)
                    if leaf.last_ns
                    else round((now_boot - leaf.start_ns) / 1e9, 3),
                    seeded=ident in self._seeded,
                    **stack_fields(tcp),
                )
            )
        return out

    # -- hygiene -----------------------------------------------------------------
    def forget(self, tgids: set[int], *, scan: bool = True, records: list | None = None) -> None:
        """Remove the watch entries and records of processes that are gone.  With ``scan``
        False (one exit), the slots are read only if one of them had a reported connection:
        reading every slot per exit cost ~1 ms each; the sweep frees what is left."""
        for tgid in tgids:
            self._kernel.unwatch(tgid)
        if not scan and not any(ident[0] in tgids for ident in self._reported):
            self._unswept = True  # their slots, if any, wait for the next sweep
        else:
            for (tgid, fd), _ in self._kernel.records() if records is None else records:
                if tgid in tgids:
                    self._kernel.free(tgid, fd)
        for ident in [i for i in self._reported if i[0] in tgids]:
            del self._reported[ident]
        self._seeded = {i for i in self._seeded if i[0] not in tgids}
        self.watched_by_user -= tgids

    def sweep(self) -> set[int]:
        """Dead watched processes (their entries removed); the caller may forget them elsewhere too."""
        watched = self._kernel.watched()
        dead = {tgid for tgid in watched if not os.path.exists(f"/proc/{tgid}")}
        if not watched and not self._reported and not self._unswept:
            return set()  # idle: no slot to look at
        self._unswept = False
        # all slots: read once (~8 ms), not again to free the dead's
        records = self._kernel.records()
        recorded = {ident[0] for ident, _ in records}
        dead |= {tgid for tgid in recorded if not os.path.exists(f"/proc/{tgid}")}
        if dead:
            self.forget(dead, records=records)
        return dead


def stack_fields(tcp: TcpSession | None) -> dict:
    """The :class:`ConnActivity` fields that come from the TCP stack's counters (none without them)."""
    if tcp is None:
        return {}
    return {
        "remote": tcp.remote,
        "bytes_in": tcp.bytes_received,
        "data_segs_in": tcp.data_segs_in,
        "stack_bytes_out": tcp.bytes_sent if tcp.bytes_sent is not None else tcp.bytes_acked,
        "data_segs_out": tcp.data_segs_out,
        "last_recv_s": tcp.last_data_recv_ms / 1000 if tcp.last_data_recv_ms is not None else None,
        "rtt_ms": tcp.rtt_us / 1000 if tcp.rtt_us is not None else None,
    }


def established_socket_inodes(tgid: int, proc_root: str = "/proc") -> set[int]:
    """Inodes of the established TCP sockets in the process's network namespace."""
    inodes: set[int] = set()
    for name in ("tcp", "tcp6"):
        try:
            with open(f"{proc_root}/{tgid}/net/{name}") as f:
                next(f, None)
                for line in f:
                    fields = line.split()
                    if len(fields) > 9 and fields[3] == "01":  # TCP_ESTABLISHED
                        inodes.add(int(fields[9]))
        except (OSError, ValueError):
            continue
    return inodes
