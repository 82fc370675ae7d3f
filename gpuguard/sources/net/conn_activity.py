"""Per-connection activity of watched processes: the kernel's records, read on an interval.

Details: docs/internals.md, "conn_activity".
"""

from __future__ import annotations

import os
import time

from gpuguard.events.abi import MapWrite
from gpuguard.events.model import ConnActivity
from gpuguard.sources.ebpf.bpf_decode import boot_to_epoch_offset
from gpuguard.sources.ebpf.kernel_maps import (
    SLOT_MULTI,
    EmptyWatch,
    map_writes,
    occupied_items,
    slot_index,
)
from gpuguard.sources.net.tcp_sessions import TcpSession, TcpSessionReader, socket_fds

ACTIVITY_TIMES = 8
INTERVAL_S = 10.0


class ConnActivityReader:
    """Reads ``conn_activity`` and maintains ``watched_tgids`` (see the module docstring)."""

    def __init__(
        self, bpf, slot_index, activity_slots: int, interval_s: float = INTERVAL_S
    ) -> None:
        self._activity = bpf[b"conn_activity"]
        # no slot is read while none was claimed since a read found them all free
        self.in_use = EmptyWatch(map_writes(bpf[b"map_writes"], MapWrite.ACTIVITY))
        self._unswept = False  # a forget left slots for the sweep to read
        self._watched = bpf[b"watched_tgids"]
        self._sock_slots = bpf[b"sock_fd_slots"]
        self._slot_index = slot_index  # (tgid, fd) -> index into sock_fd_slots
        self._activity_slots = activity_slots
        self.interval_s = interval_s
        self._offset = boot_to_epoch_offset()
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
        self._watched[self._watched.Key(tgid)] = self._watched.Leaf(1)
        self.watched_by_user.add(tgid)
        return self._seed(tgid)

    def _seed(self, tgid: int) -> int:
        inodes = established_socket_inodes(tgid)
        if not inodes:
            return 0
        now_ns = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        seeded = 0
        for inode, fd in socket_fds(tgid).items():
            if inode not in inodes:
                continue
            owner = activity_owner(tgid, fd)
            candidates = self._slots_of(tgid, fd)
            if any(leaf.owner == owner for _, leaf in candidates):
                continue  # the kernel already has it (connected while watched)
            free = [key for key, leaf in candidates if leaf.owner == 0]
            if not free:
                continue  # both slots taken: the probes count such a connection as lost
            leaf = self._activity.Leaf()
            leaf.owner = owner
            leaf.start_ns = now_ns
            self._activity[free[0]] = leaf
            # Writes look at a socket only when its slot says so; user space may only write MULTI.
            self._sock_slots[self._sock_slots.Key(self._slot_index(tgid, fd))] = (
                self._sock_slots.Leaf(SLOT_MULTI)
            )
            self._seeded.add((tgid, fd))
            self.in_use.invalidate()
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
        if not self._reported and self._nobody_watched():
            return []  # nothing watched, nothing said before: skip reading every slot (idle)
        now_boot = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        out: list[ConnActivity] = []
        records = self._records()
        stack = self.tcp.read({owner_ident(leaf.owner)[0] for leaf in records}) if records else None
        self.unreadable = stack.unreadable if stack else []
        for leaf in records:
            ident = tgid, fd = owner_ident(leaf.owner)
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

    def _nobody_watched(self) -> bool:
        """No process is watched (one key lookup): no slot can have been claimed since."""
        return next(iter(self._watched.keys()), None) is None

    def _records(self) -> list:
        """The occupied activity slots (copies), read in one batch where the kernel can; none,
        without a read, while no slot was claimed since a read found them all free."""
        count = self.in_use.start()
        if count is None:
            return []
        try:
            records = [leaf for _, leaf in occupied_items(self._activity)]
        except OSError:  # kernels without batch ops on arrays (< 5.6)
            records = [leaf for _, leaf in self._activity.items() if leaf.owner]
        self.in_use.done(count, empty=not records)
        return records

    # -- hygiene -----------------------------------------------------------------
    def forget(self, tgids: set[int], *, scan: bool = True, records: list | None = None) -> None:
        """Remove the watch entries and records of processes that are gone.  With ``scan``
        False (one exit), the slots are read only if one of them had a reported connection:
        reading every slot per exit cost ~1 ms each; the sweep frees what is left."""
        for tgid in tgids:
            try:
                del self._watched[self._watched.Key(tgid)]
            except KeyError:
                pass
        if not scan and not any(ident[0] in tgids for ident in self._reported):
            self._unswept = True  # their slots, if any, wait for the next sweep
        else:
            for leaf in self._records() if records is None else records:
                tgid, fd = owner_ident(leaf.owner)
                if tgid in tgids:
                    self._free(tgid, fd)
        for ident in [i for i in self._reported if i[0] in tgids]:
            del self._reported[ident]
        self._seeded = {i for i in self._seeded if i[0] not in tgids}
        self.watched_by_user -= tgids

    def sweep(self) -> set[int]:
        """Dead watched processes (their entries removed); the caller may forget them elsewhere too."""
        dead = {k.value for k in self._watched.keys() if not os.path.exists(f"/proc/{k.value}")}
        if not dead and not self._reported and not self._unswept and self._nobody_watched():
            return set()  # idle: no slot to look at
        self._unswept = False
        records = self._records()  # all slots: read once (~8 ms), not again to free the dead's
        recorded = {owner_ident(leaf.owner)[0] for leaf in records}
        dead |= {tgid for tgid in recorded if not os.path.exists(f"/proc/{tgid}")}
        if dead:
            self.forget(dead, records=records)
        return dead

    def _slots_of(self, tgid: int, fd: int) -> list:
        """(key, record) of the two slots (tgid, fd)'s record may live in."""
        first = activity_index(tgid, fd, self._activity_slots)
        return [
            (key, self._activity[key])
            for key in (self._activity.Key(first), self._activity.Key(first + 1))
        ]

    def _free(self, tgid: int, fd: int) -> None:
        owner = activity_owner(tgid, fd)
        for key, leaf in self._slots_of(tgid, fd):
            if leaf.owner == owner:
                self._activity[key] = self._activity.Leaf()


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


def activity_owner(tgid: int, fd: int) -> int:
    """The owner field of (tgid, fd)'s record (gg_activity_owner in maps.bpf.h)."""
    return (tgid << 32) | (fd & 0xFFFFFFFF)


def owner_ident(owner: int) -> tuple[int, int]:
    """(tgid, fd) of an owner field."""
    return owner >> 32, owner & 0xFFFFFFFF


def activity_index(tgid: int, fd: int, slots: int) -> int:
    """The first of the two slots (tgid, fd)'s record may live in (gg_activity_index in maps.bpf.h)."""
    return slot_index(tgid, fd, slots) & ~1


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
