"""The sensor's counter drains: the kernel's ioctl and lost counters, sent up as their growth.

The probes count ioctls per (process, device class, command) and what they could not deliver
per reason; :class:`CounterDrain` reads both on the sensor's drain interval and turns each
increase into a ``gpu_ioctl`` or ``lost`` event.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gpuguard.events.abi import LostSlot, device_class_name
from gpuguard.events.ioctl_names import ioctl_name
from gpuguard.events.model import Event, GpuIoctl, Lost
from gpuguard.sources.ebpf.exec_filter import ExecFilter
from gpuguard.sources.ebpf.kernel_maps import KernelMaps, lookup_batch

# Walking a hash map starts with a look through all its buckets (~90 us for ioctl_counts' 65,536,
# however empty): with no GPU process known and nothing counted, ioctl_counts is walked this
# seldom (a GPU open whose event the ring lost still has its counts reported, this late)...
IOCTL_IDLE_WALK_S = 5.0
# ...and the exec filter's counters (status and metrics only) are read this often.
EXEC_COUNTS_EVERY_S = 2.0


class CounterDrain:
    """Reads ``ioctl_counts`` and ``lost_counts`` and keeps what each counter said last."""

    def __init__(
        self,
        tables: dict,
        maps: KernelMaps,
        stats,
        gpu_tgids: set[int],
        header_of: Callable[[int], tuple[str, int, int, int]],
        exec_filter: ExecFilter | None,
    ) -> None:
        self.tables = tables
        self.maps = maps
        self.stats = stats  # the sensor's SensorStats: events and lost counted here too
        self._gpu_tgids = gpu_tgids  # the sensor's set of processes with a GPU open
        self.header_of = header_of  # tgid -> (comm, uid, gid, cgroup_id)
        self.exec_filter = exec_filter
        self._ioctl_seen: dict[tuple[int, int, int], int] = {}
        self._lost_seen: dict[int, int] = {}
        self._next_ioctl_walk = 0.0  # the next walk of ioctl_counts while no GPU process is known
        self._next_exec_counts = 0.0

    @property
    def idle(self) -> bool:
        """No GPU process known and nothing counted: the drain has only the lost counts to read."""
        return not self._gpu_tgids and not self._ioctl_seen

    def every_counter_now(self) -> None:
        """The next drain reads every counter, whatever its interval says (e.g. before stopping)."""
        self._next_ioctl_walk = self._next_exec_counts = 0.0

    def forget(self, tgids: set[int]) -> None:
        """Drop what the counters of these (dead) processes said last."""
        for ident in [i for i in self._ioctl_seen if i[0] in tgids]:
            del self._ioctl_seen[ident]

    def drain_into(self, out: list[Event], only_tgid: int | None = None) -> None:
        """Append ioctl deltas (all processes, or one that is exiting) and lost counts."""
        now = time.time()
        table = self.tables["ioctl_counts"]
        mono = time.monotonic()
        if only_tgid is None and self.idle:
            # idle: counts need a tracked GPU fd; walked seldom, and not while still empty
            watch = self.maps.may_hold["ioctl_counts"]
            count = watch.start() if mono >= self._next_ioctl_walk else None
            if count is not None:
                self._next_ioctl_walk = mono + IOCTL_IDLE_WALK_S
                items = table.items()
                watch.done(count, empty=not items)
            else:
                items = []
        else:
            items = table.items()
        for key, value in items:
            if only_tgid is not None and key.tgid != only_tgid:
                continue
            ident = (key.tgid, key.device_class, key.command)
            total = value.value
            delta = total - self._ioctl_seen.get(ident, 0)
            if delta <= 0:
                continue
            self._ioctl_seen[ident] = total
            out.append(self._ioctl_event(now, key.tgid, key.device_class, key.command, delta))
        if only_tgid is not None:
            return
        if self.exec_filter is not None and mono >= self._next_exec_counts:
            self._next_exec_counts = mono + EXEC_COUNTS_EVERY_S
            self.exec_filter.sent_up = self.stats.events["exec"]
            self.exec_filter.read_counts()
        keys, values, n = lookup_batch(self.tables["lost_counts"], 0)  # one syscall, all slots
        totals = {keys[i]: sum(values[i]) for i in range(n)}  # a slot's value: one per CPU
        for slot in LostSlot:
            if slot == LostSlot.SLOTS:
                continue
            total = totals.get(slot, 0)
            delta = total - self._lost_seen.get(slot, 0)
            if delta > 0:
                self._lost_seen[slot] = total
                what = slot.name.lower().replace("_", "-")
                self.stats.lost[what] += delta
                out.append(Lost(time=now, pid=0, what=what, count=delta))

    def _ioctl_event(
        self, now: float, tgid: int, device_class: int, command: int, count: int
    ) -> GpuIoctl:
        comm, uid, gid, cgroup_id = self.header_of(tgid)
        class_name = device_class_name(device_class)
        self.stats.events["gpu_ioctl"] += 1
        return GpuIoctl(
            time=now,
            pid=tgid,
            uid=uid,
            gid=gid,
            cgroup_id=cgroup_id,
            comm=comm,
            device_class=class_name,
            command=command,
            command_name=ioctl_name(class_name, command),
            count=count,
        )
