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

import os
from collections.abc import Callable

from gpuguard.events.abi import DEFINES

SLOT_MULTI = DEFINES["GG_SLOT_MULTI"]
SLOT_HASH_MUL = DEFINES["GG_SLOT_HASH_MUL"]


def slot_index(tgid: int, fd: int, slots: int) -> int:
    """The probes' fd-slot index for (tgid, fd) (gg_slot_index in maps.bpf.h)."""
    return ((tgid * SLOT_HASH_MUL) + (fd & 0xFFFFFFFF)) & 0xFFFFFFFF & (slots - 1)


class KernelMaps:
    """Removes stale entries from the probes' maps (see the module docstring)."""

    def __init__(self, tables: dict, fd_slots: int) -> None:
        self.tables = tables
        self.fd_slots = fd_slots

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
            for key in [k for k in table.keys() if k.tgid in tgids]:
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
        for key in list(self.tables["tracked_fds"].keys()):
            if not os.path.exists(f"/proc/{key.tgid}"):
                dead.add(key.tgid)
                continue
            is_gpu, _ = fd_is_gpu(key.tgid, key.fd)
            if not is_gpu:
                self.forget_fd(key.tgid, key.fd)
                swept += 1
        for key in list(self.tables["ioctl_counts"].keys()):
            if not os.path.exists(f"/proc/{key.tgid}"):
                dead.add(key.tgid)
        return dead, swept
