"""The probes' per-connection activity records and watch list, the kernel side of conn_activity.

``gpuguard.sources.net.conn_activity`` turns the records into events; it reaches the kernel's
maps only through an :class:`ActivityMap` it is given.  Slot layout: docs/internals.md,
"conn_activity".
"""

from __future__ import annotations

from gpuguard.events.abi import MapWrite
from gpuguard.sources.ebpf.bpf_decode import boot_to_epoch_offset
from gpuguard.sources.ebpf.kernel_maps import (
    SLOT_MULTI,
    EmptyWatch,
    map_writes,
    occupied_items,
    slot_index,
)


class ActivityMap:
    """``conn_activity``, ``watched_tgids`` and the socket slots in front of them."""

    def __init__(self, bpf, fd_slots: int, activity_slots: int) -> None:
        self._activity = bpf[b"conn_activity"]
        # no slot is read while none was claimed since a read found them all free
        self.in_use = EmptyWatch(map_writes(bpf[b"map_writes"], MapWrite.ACTIVITY))
        self._watched = bpf[b"watched_tgids"]
        self._sock_slots = bpf[b"sock_fd_slots"]
        self._fd_slots = fd_slots
        self._activity_slots = activity_slots
        self.epoch_offset = boot_to_epoch_offset()  # the records' boot-clock times -> epoch

    # -- the watch list ----------------------------------------------------------
    def watch(self, tgid: int) -> None:
        """Give every connection of ``tgid`` a record from now on (raises when the map is full)."""
        self._watched[self._watched.Key(tgid)] = self._watched.Leaf(1)

    def unwatch(self, tgid: int) -> None:
        try:
            del self._watched[self._watched.Key(tgid)]
        except KeyError:
            pass

    def watched(self) -> list[int]:
        return [k.value for k in self._watched.keys()]

    def nobody_watched(self) -> bool:
        """No process is watched (one key lookup): no slot can have been claimed since."""
        return next(iter(self._watched.keys()), None) is None

    # -- the records -------------------------------------------------------------
    def records(self) -> list[tuple[tuple[int, int], object]]:
        """``((tgid, fd), record)`` of the occupied activity slots (copies), read in one batch
        where the kernel can; none, without a read, while no slot was claimed since a read found
        them all free."""
        count = self.in_use.start()
        if count is None:
            return []
        try:
            records = [leaf for _, leaf in occupied_items(self._activity)]
        except OSError:  # kernels without batch ops on arrays (< 5.6)
            records = [leaf for _, leaf in self._activity.items() if leaf.owner]
        self.in_use.done(count, empty=not records)
        return [(owner_ident(leaf.owner), leaf) for leaf in records]

    def seed(self, tgid: int, fd: int, start_ns: int) -> bool:
        """Give an existing connection a record started at ``start_ns`` (boot clock); False when
        the kernel already has one for it or both of its slots are taken."""
        owner = activity_owner(tgid, fd)
        candidates = self._slots_of(tgid, fd)
        if any(leaf.owner == owner for _, leaf in candidates):
            return False  # the kernel already has it (connected while watched)
        free = [key for key, leaf in candidates if leaf.owner == 0]
        if not free:
            return False  # both slots taken: the probes count such a connection as lost
        leaf = self._activity.Leaf()
        leaf.owner = owner
        leaf.start_ns = start_ns
        self._activity[free[0]] = leaf
        # Writes look at a socket only when its slot says so; user space may only write MULTI.
        self._sock_slots[self._sock_slots.Key(slot_index(tgid, fd, self._fd_slots))] = (
            self._sock_slots.Leaf(SLOT_MULTI)
        )
        self.in_use.invalidate()
        return True

    def free(self, tgid: int, fd: int) -> None:
        owner = activity_owner(tgid, fd)
        for key, leaf in self._slots_of(tgid, fd):
            if leaf.owner == owner:
                self._activity[key] = self._activity.Leaf()

    def _slots_of(self, tgid: int, fd: int) -> list:
        """(key, record) of the two slots (tgid, fd)'s record may live in."""
        first = activity_index(tgid, fd, self._activity_slots)
        return [
            (key, self._activity[key])
            for key in (self._activity.Key(first), self._activity.Key(first + 1))
        ]


def activity_owner(tgid: int, fd: int) -> int:
    """The owner field of (tgid, fd)'s record (gg_activity_owner in maps.bpf.h)."""
    return (tgid << 32) | (fd & 0xFFFFFFFF)


def owner_ident(owner: int) -> tuple[int, int]:
    """(tgid, fd) of an owner field."""
    return owner >> 32, owner & 0xFFFFFFFF


def activity_index(tgid: int, fd: int, slots: int) -> int:
    """The first of the two slots (tgid, fd)'s record may live in (gg_activity_index in maps.bpf.h)."""
    return slot_index(tgid, fd, slots) & ~1
