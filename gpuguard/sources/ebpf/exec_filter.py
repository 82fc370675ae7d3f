"""The exec filter's user-space half: which execs the kernel keeps, and sending up those that live.

The probes (``GG_EXEC_FILTER``, "exec filter" in probes/maps.bpf.h) send an exec up in full
only for a process that matters; every other exec waits in the kernel's ``exec_pending`` map
and is counted per cgroup.  This module

* fills ``exec_names`` with the FNV-1a hashes of the program names the rules look for
  (:func:`name_hash`, the same hash the probe computes over an exec's lower-cased basename);
* sends up, every :data:`PROMOTE_EVERY_S`, the pending execs of processes still alive after
  :data:`PROMOTE_AGE_S` (a short exec that turned into a long-lived process), oldest first;
* sends up the pending ancestors of a process that shows up (:meth:`ExecFilter.promote_chain`),
  so a GPU opener's tree is known whatever the flood around it;
* reads the per-cgroup counts of execs kept in the kernel.
"""

from __future__ import annotations

import ctypes as ct
import time
from collections.abc import Callable, Iterable

from gpuguard.events.abi import ExecFilterCount
from gpuguard.sources.ebpf.kernel_maps import EmptyWatch, lookup_batch

# enum gg_exec_filter_count, as counter names: promoted, pending_full, cgroups_full, pending_added
COUNTS = {c.name.lower(): c.value for c in ExecFilterCount if c != ExecFilterCount.SLOTS}
FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
PROMOTE_AGE_S = 0.5  # a pending process alive this long is sent up
PROMOTE_EVERY_S = 0.25  # how often the pending map is looked at
PENDING_READ_ROOM = 64  # the pending execs one read holds before its buffer grows
CHAIN_DEPTH = 8  # ancestors sent up for one process (facts keep up to 8)


def name_hash(data: bytes) -> int:
    """FNV-1a 64 of ``data``, as the probe hashes a lower-cased basename."""
    h = FNV_OFFSET
    for byte in data:
        h = ((h ^ byte) * FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return h


def interest_keys(names: Iterable[str]) -> set[int]:
    """The exec_names keys: the lower-cased program names (a path is no basename: skipped)."""
    return {name_hash(n.lower().encode()) for n in names if n and "/" not in n}


def parent_of(pid: int) -> int:
    """The parent pid from /proc/PID/stat (0 when gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


class ExecFilter:
    """The exec filter's maps in a loaded program (see the module docstring)."""

    def __init__(self, bpf, decode: Callable) -> None:
        self.pending = bpf[b"exec_pending"]
        self.interest = bpf[b"exec_interest"]
        self.names = bpf[b"exec_names"]
        self.aggregated_map = bpf[b"exec_aggregated"]
        self.counts_map = bpf[b"exec_filter_counts"]
        self.wake_map = bpf[b"exec_wake"]
        self.decode = decode  # a pending gg_exec -> model Exec
        self.aggregated: dict[int, int] = {}  # cgroup id -> execs kept in the kernel (cumulative)
        self.promoted_by_age = 0
        self.promoted_as_ancestors = 0
        self.counts = dict.fromkeys(COUNTS, 0)
        self.counts_read = 0  # bumped by each read_counts
        # exec records the sensor sent on (at exec, or promoted), set by it just before each
        # read_counts: the counts and this total are then of one moment (the metrics subtract)
        self.sent_up = 0
        self._next_promote = 0.0
        # the walk of exec_pending is skipped while the kernel's count of its writes stands still
        # since a walk that left it empty
        self.pending_watch = EmptyWatch(self._added)

    # -- what the kernel looks for ---------------------------------------------------
    def set_names(self, names: Iterable[str]) -> int:
        """Replace the program names whose execs go up in full; returns the keys set."""
        keys = interest_keys(names)
        for key in list(self.names.keys()):
            if key.value not in keys:
                del self.names[key]
        one = ct.c_uint8(1)
        for key in keys:
            self.names[self.names.Key(key)] = one
        return len(keys)

    def mark(self, tgid: int, flags: int) -> None:
        """Send up the execs of ``tgid`` and of what it forks from now on."""
        key = self.interest.Key(tgid)
        try:
            old = self.interest[key].value
        except KeyError:
            old = 0
        self.interest[key] = ct.c_uint8(old | flags)

    # -- pending execs ---------------------------------------------------------------
    def due(self, now: float) -> bool:
        if now < self._next_promote:
            return False
        self._next_promote = now + PROMOTE_EVERY_S
        return True

    @property
    def next_turn(self) -> float:
        """The monotonic time of the next look at the pending execs."""
        return self._next_promote

    @property
    def may_hold_execs(self) -> bool:
        """False only while the last walk left the map empty: the kernel then wakes user space
        with its next kept exec (a GG_KIND_WAKE record: :meth:`woken`)."""
        return not self.pending_watch.known_empty

    def woken(self) -> None:
        """The kernel's wake-up record came: an exec is pending again.  The map is no longer
        known empty, so the sensor's waits count the filter's next turn again (until this they
        stopped only at the sensor's other work, seconds off on an idle host: long enough for a
        short-lived process to end unseen).  That turn is when the exec that woke it comes of
        age: everything in the map is younger (it was empty), so a look before then finds
        nothing to send up."""
        self.pending_watch.invalidate()
        self._next_promote = max(self._next_promote, time.monotonic() + PROMOTE_AGE_S)

    def _entries(self) -> list:
        """(tgid, record) of every pending exec: few (the young processes), so one batch read
        into a small buffer (one syscall for up to 64, where a walk of the keys took two an
        entry, ~9 µs each); one lookup a key on kernels without batch operations."""
        try:
            keys, records, n = lookup_batch(self.pending, 0, room=PENDING_READ_ROOM)
        except OSError:
            pass
        else:  # u32 keys: ctypes gives them as ints; each record keeps its buffer alive
            return [(keys[i], records[i]) for i in range(n)]
        out = []
        for key in self.pending.keys():
            try:
                out.append((key.value, self.pending[key]))
            except KeyError:
                continue  # exited while we looked
        return out

    def take_old(self, age_s: float = PROMOTE_AGE_S) -> list:
        """Pending execs older than ``age_s`` (model events, oldest first), taken out of the map.

        One whose process exits meanwhile is left to the kernel (taken by its exit: counted).
        Nothing is added to the map without the kernel's ``pending_added`` count moving, so
        while it stands still since a walk that left the map empty the walk is skipped: on an
        idle host that walk (every bucket of a 16,384-bucket map, 4 times a second) was most
        of the sensor's idle cost.  The count is read before the walk, so an exec written
        during the walk is either seen by it or moves the count for the next turn.  Execs kept
        after a walk are younger than any it saw, so the next turn is when the oldest one it
        left comes of age (at least :data:`PROMOTE_EVERY_S` on), not every turn."""
        added = self.pending_watch.start()
        if added is None:
            return []
        boot_now = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        limit = boot_now - int(age_s * 1e9)
        entries = self._entries()
        old = [(v.hdr.time_ns, k, v) for k, v in entries if v.hdr.time_ns <= limit]
        old.sort(key=lambda item: item[0])
        out = []
        for _, key, value in old:
            if self._take(key):
                out.append(self.decode(value))
        self.promoted_by_age += len(out)
        young = [v.hdr.time_ns for _, v in entries if v.hdr.time_ns > limit]
        self.pending_watch.done(added, empty=not young)
        if not young:
            self._arm_wake(added)
        else:  # none can come of age before the oldest left: no look until then
            due_in = (min(young) + int(age_s * 1e9) - boot_now) / 1e9
            self._next_promote = max(self._next_promote, time.monotonic() + due_in)
        return out

    def _arm_wake(self, added: int) -> None:
        """The map was found empty: ask the kernel to wake user space at its next kept exec
        (``exec_wake``), so the sensor may sleep until then.  An exec kept between the count read
        before the walk and the arming moved the count: the next turn walks as usual."""
        self.wake_map[self.wake_map.Key(0)] = ct.c_uint32(1)
        if self._added() != added:
            self.pending_watch.invalidate()

    def _added(self) -> int:
        return self.counts_map[self.counts_map.Key(ExecFilterCount.PENDING_ADDED)].value

    def _take(self, tgid: int) -> bool:
        try:
            del self.pending[self.pending.Key(tgid)]
        except KeyError:
            return False  # exited (or sent up by the kernel) meanwhile
        return True

    def take(self, tgid: int):
        """The pending exec of ``tgid`` (a model event), taken out of the map; None if none."""
        try:
            value = self.pending[self.pending.Key(tgid)]
        except KeyError:
            return None
        if not self._take(tgid):
            return None
        return self.decode(value)

    def promote_chain(self, ppid: int) -> list:
        """The pending execs of ``ppid`` and its ancestors, eldest first; stops at the first
        that is not pending (user space knows it and what is above it), or after CHAIN_DEPTH."""
        chain = []
        pid = ppid
        for _ in range(CHAIN_DEPTH):
            if pid <= 1:
                break
            event = self.take(pid)
            if event is None:
                break
            chain.append(event)
            pid = parent_of(pid)
        chain.reverse()
        self.promoted_as_ancestors += len(chain)
        return chain

    # -- counts ----------------------------------------------------------------------
    def read_counts(self) -> None:
        """Refresh the per-cgroup totals and the filter's own counters from the kernel."""
        keys, values, n = lookup_batch(self.aggregated_map, 0)  # one syscall, not two a cgroup
        for i in range(n):  # u64 keys and values: ctypes gives them as ints
            self.aggregated[keys[i]] = values[i]
        _, counts, n = lookup_batch(self.counts_map, 0)
        for name, index in COUNTS.items():
            self.counts[name] = counts[index] if index < n else 0
        self.counts_read += 1

    def summary(self, top: int = 10) -> dict:
        """For the status file: execs kept in the kernel (total and the busiest cgroups), and
        how many went up later (by the kernel, by age, as ancestors)."""
        busiest = sorted(self.aggregated.items(), key=lambda kv: -kv[1])[:top]
        return {
            "aggregated": self.aggregated_total(),
            "aggregated_by_cgroup": {str(cgroup): n for cgroup, n in busiest},
            "sent_up": self.sent_up,
            "promoted_by_kernel": self.counts["promoted"],
            "promoted_by_age": self.promoted_by_age,
            "promoted_as_ancestors": self.promoted_as_ancestors,
            "pending_full": self.counts["pending_full"],
            "cgroups_full": self.counts["cgroups_full"],
        }

    def aggregated_total(self) -> int:
        return sum(self.aggregated.values())
