"""User space's side of the probes' per-process maps: forgetting fds and processes, sweeping the dead.

The kernel removes a tracked fd on close(2) and a process's entries on exit
only as far as it sees them; fds closed by close_range, close-on-exec or fd
passing, and processes that died while the sensor was not looking, leave
entries behind.  :class:`KernelMaps` removes those from ``tracked_fds``,
``ioctl_counts`` and ``fresh_sockets`` and keeps the fd slots in front of them
honest: user space only ever writes ``SLOT_MULTI`` into a slot (the kernel may
be changing it at the same moment, and "ask the map" is right whatever it did).
"""

from __future__ import annotations

import ctypes as ct
import errno
import os
from collections.abc import Callable

from gpuguard.events.abi import DEFINES, MapWrite

SLOT_MULTI = DEFINES["GG_SLOT_MULTI"]
SLOT_HASH_MUL = DEFINES["GG_SLOT_HASH_MUL"]


class EmptyWatch:
    """Whether a walk of a kernel map can be skipped because the map is still empty.

    The kernel counts every entry it adds to the map (``read()``: ``map_writes``, or the exec
    filter's own counter); user space only removes.  A walk that finds the map empty notes the
    count read just before it: while the count stays there, nothing was added since.  Reading
    the count first means an entry added during the walk is either seen by it or moves the
    count for the next one.  On an idle host the walks skipped this way (a hash map's walk
    starts by looking through every bucket) were most of the sensor's own CPU."""

    def __init__(self, read: Callable[[], int]) -> None:
        self.read = read
        self._empty_at: int | None = None
        self.skipped = 0

    def start(self) -> int | None:
        """The count to hand to :meth:`done` after the walk, or None: skip it, still empty."""
        count = self.read()
        if count == self._empty_at:
            self.skipped += 1
            return None
        return count

    def done(self, count: int, empty: bool) -> None:
        self._empty_at = count if empty else None

    def invalidate(self) -> None:
        """User space wrote an entry itself: the next walk happens."""
        self._empty_at = None

    @property
    def known_empty(self) -> bool:
        return self._empty_at is not None


def map_writes(table, slot: MapWrite) -> Callable[[], int]:
    """The reader of one ``map_writes`` counter, for :class:`EmptyWatch`."""
    key = table.Key(slot)
    return lambda: table[key].value


def slot_index(tgid: int, fd: int, slots: int) -> int:
    """The probes' fd-slot index for (tgid, fd) (gg_slot_index in maps.bpf.h)."""
    return ((tgid * SLOT_HASH_MUL) + (fd & 0xFFFFFFFF)) & 0xFFFFFFFF & (slots - 1)


def occupied_items(table, batch: int = 0) -> list[tuple]:
    """The (key, value) pairs of an array map whose value starts with a non-zero u64 (a slot
    in use, e.g. ``conn_activity``'s owner): one batch read, the owners scanned as integers,
    ctypes objects made only for the slots in use (the whole map as objects cost ~8 ms)."""
    keys, values, total = lookup_batch(table, batch)
    stride, rest = divmod(ct.sizeof(table.Leaf), 8)
    if rest or total == 0:
        return [(keys[i], values[i]) for i in range(total) if bytes(values[i])[:8] != bytes(8)]
    owners = memoryview(values).cast("B").cast("Q")[: total * stride : stride].tolist()
    return [(keys[i], values[i]) for i, owner in enumerate(owners) if owner]


def lookup_batch(table, batch: int, room: int = 0) -> tuple:
    """(keys, values, count read) of a whole bcc map, read with BPF_MAP_LOOKUP_BATCH: an array
    or a hash map; a per-CPU map's value is bcc's ``Leaf``, one value per possible CPU.

    bcc's own ``items_lookup_batch`` (0.26) passes one variable as both the batch token and
    the count, so the kernel's reply to one overwrites the other: it can loop without end.
    Here they are separate; the kernel ends with ENOENT.  ``batch`` caps the entries per
    call (0: as many as the buffer holds).  ``room`` is the buffer's first size in entries
    (0: the whole map); it doubles when the map holds more, or when a hash bucket does not
    fit in what is left (ENOSPC), so a map that holds few (the exec filter's pending execs)
    is read into a small buffer, not one of its size.  A kernel without batch operations
    (before 5.6) raises OSError."""
    from bcc.libbcc import lib

    size = table.max_entries
    room = min(room or size, size)
    keys, values = (table.Key * room)(), (table.Leaf * room)()
    token_in, token_out, count = ct.c_uint32(0), ct.c_uint32(0), ct.c_uint32(0)
    key_size, value_size = ct.sizeof(table.Key), ct.sizeof(table.Leaf)
    total = 0
    while total < size:
        if total == room:  # the buffer is full and the map goes on
            room = min(room * 2, size)
            keys, values = _grown(keys, table.Key, room), _grown(values, table.Leaf, room)
        count.value = min(room - total, batch or room)
        res = lib.bpf_lookup_batch(
            table.map_fd,
            ct.byref(token_in) if total else None,
            ct.byref(token_out),
            ct.byref(keys, key_size * total),
            ct.byref(values, value_size * total),
            ct.byref(count),
        )
        err = ct.get_errno()
        total += count.value
        if res != 0:
            if err == errno.ENOENT:
                break  # the end of the map
            if err == errno.ENOSPC and count.value == 0 and room < size:
                room = min(room * 2, size)  # a bucket bigger than what is left: the same call
                keys, values = _grown(keys, table.Key, room), _grown(values, table.Leaf, room)
                continue
            raise OSError(err, f"BPF_MAP_LOOKUP_BATCH: {os.strerror(err)}")
        if count.value == 0:
            break
        token_in.value = token_out.value
    return keys, values, min(total, size)


def _grown(array, kind, room: int):
    """``array`` copied into a ctypes array of ``room`` ``kind``s."""
    bigger = (kind * room)()
    ct.memmove(bigger, array, ct.sizeof(array))
    return bigger


class KernelMaps:
    """Removes stale entries from the probes' maps (see the module docstring)."""

    def __init__(self, tables: dict, fd_slots: int) -> None:
        self.tables = tables
        self.fd_slots = fd_slots
        writes = tables["map_writes"]
        self.may_hold = {
            "tracked_fds": EmptyWatch(map_writes(writes, MapWrite.TRACKED_FDS)),
            "ioctl_counts": EmptyWatch(map_writes(writes, MapWrite.IOCTL_KEYS)),
        }

    def forget_fd(self, tgid: int, fd: int) -> None:
        table = self.tables["tracked_fds"]
        try:
            del table[table.Key(tgid, fd)]
        except KeyError:
            pass
        self.unslot(tgid, fd)

    def unslot(self, tgid: int, fd: int) -> None:
        """A tracked fd left tracked_fds from user space: its slot may still carry its
        tag (and device class), so make the probes ask the map instead."""
        slots = self.tables["gpu_fd_slots"]
        slots[slots.Key(slot_index(tgid, fd, self.fd_slots))] = slots.Leaf(SLOT_MULTI)

    def forget_fresh(self, tgid: int, fds: set[int]) -> None:
        """Connections of an exited process whose first writes were still being captured."""
        table = self.tables["fresh_sockets"]
        for fd in fds:
            try:
                del table[table.Key(tgid, fd)]
            except KeyError:
                pass

    def forget_processes(self, tgids: set[int]) -> int:
        """Delete the tracked fds and ioctl counters of these (dead) processes in one pass
        over each map; return how many tracked fds went."""
        removed = 0
        for name in ("tracked_fds", "ioctl_counts"):
            table = self.tables[name]
            for key in [k for k in self.keys(name) if k.tgid in tgids]:
                try:
                    del table[key]
                except KeyError:
                    pass
                if name == "tracked_fds":
                    removed += 1
                    self.unslot(key.tgid, key.fd)  # the pid may come back
        return removed

    def sweep(
        self, fd_is_gpu: Callable[[int, int], tuple[bool, str | None]]
    ) -> tuple[set[int], int]:
        """Forget tracked fds that no longer refer to a GPU file; return (dead processes, fds forgotten)."""
        dead: set[int] = set()
        swept = 0
        for key in self.keys("tracked_fds"):
            if not os.path.exists(f"/proc/{key.tgid}"):
                dead.add(key.tgid)
                continue
            is_gpu, _ = fd_is_gpu(key.tgid, key.fd)
            if not is_gpu:
                self.forget_fd(key.tgid, key.fd)
                swept += 1
        for key in self.keys("ioctl_counts"):
            if not os.path.exists(f"/proc/{key.tgid}"):
                dead.add(key.tgid)
        return dead, swept

    def keys(self, name: str) -> list:
        """The keys of ``tracked_fds`` or ``ioctl_counts``; none, without a walk, while the
        map is known to be empty (:class:`EmptyWatch`)."""
        watch = self.may_hold[name]
        count = watch.start()
        if count is None:
            return []
        keys = list(self.tables[name].keys())
        watch.done(count, empty=not keys)
        return keys
