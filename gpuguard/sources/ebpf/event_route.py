"""The sensor's per-event step: a table from event type to its handler, each returning what to emit.

:meth:`EventRouter.route` takes one decoded record: the handler of its type does that type's
bookkeeping and returns the event to emit, or None to drop it.  The pending execs of its
ancestors (exec filter) go up before it.  The table is built once; a type without a handler
goes up as it is.  This is the hot path (one call per kernel record): nothing here allocates
per event beyond what a handler must read.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from dataclasses import dataclass

from gpuguard.events.abi import DeviceClass
from gpuguard.events.devices import classify_device_path
from gpuguard.events.model import Connect, Event, Exec, Exit, GpuOpen, HugeAlloc, NetPayload
from gpuguard.sources.ebpf.counter_drain import CounterDrain
from gpuguard.sources.ebpf.exec_filter import ExecFilter, parent_of
from gpuguard.sources.ebpf.exit_gens import ExitGenTable
from gpuguard.sources.ebpf.kernel_maps import KernelMaps
from gpuguard.sources.net.conn_activity import ConnActivityReader
from gpuguard.sources.net.payload_streams import PayloadStreams
from gpuguard.sources.proc.gpu_fds import fd_is_gpu

CHAIN_CHECKED_MAX = 65536  # pids remembered as having their ancestors sent up


@dataclass(slots=True)
class ProcessHeader:
    comm: str
    uid: int
    gid: int
    cgroup_id: int


class EventRouter:
    """Routes decoded records into ``pending`` (the sensor's next poll), by the table of
    :meth:`_table`; shares the sensor's ``headers`` and ``gpu_tgids``."""

    def __init__(
        self,
        *,
        stats,
        pending: list[Event],
        headers: dict[int, ProcessHeader],
        gpu_tgids: set[int],
        maps: KernelMaps,
        counters: CounterDrain,
        streams: PayloadStreams,
        payload_capture: bool,
        activity: ConnActivityReader | None = None,
        exec_filter: ExecFilter | None = None,
        exit_generations: ExitGenTable | None = None,
    ) -> None:
        self.stats, self.pending = stats, pending
        self.headers, self.gpu_tgids = headers, gpu_tgids
        self.maps, self.counters, self.streams = maps, counters, streams
        self.payload_capture = payload_capture
        self.activity = activity
        self.exec_filter = exec_filter
        self.exit_generations = exit_generations
        self.chain_checked: set[int] = set()  # pids whose pending ancestors were sent up
        self.handlers: dict[type, Callable[[Event], Event | None]] = self._table()

    def _table(self) -> dict[type, Callable[[Event], Event | None]]:
        return {
            GpuOpen: self._gpu_open,
            NetPayload: self._net_payload,
            HugeAlloc: self._huge_alloc,
            Connect: self._connect,
            Exec: self._exec,
            Exit: self._exit,
        }

    def route(self, event: Event) -> None:
        """One record: the handler of its type; what it returns goes up."""
        handler = self.handlers.get(type(event))
        if handler is not None:
            event = handler(event)
            if event is None:
                return
        self.stats.events[event.kind] += 1
        self.pending.append(event)

    # -- the handlers: each returns the event to emit, or None --------------------------------
    def _gpu_open(self, event: GpuOpen) -> GpuOpen | None:
        if event.relative and not self._confirm_relative_open(event):
            return None
        self.gpu_tgids.add(event.pid)
        self._remember_header(event)
        self._send_up_ancestors(event.pid, 0)
        return event

    def _net_payload(self, event: NetPayload) -> NetPayload:
        self.streams.recognise(event)
        return event

    def _huge_alloc(self, event: HugeAlloc) -> HugeAlloc:
        self._send_up_ancestors(event.pid, 0)
        return event

    def _connect(self, event: Connect) -> Connect:
        self._send_up_ancestors(event.pid, 0)
        self.streams.connected(
            event.pid,
            event.fd,
            self.payload_capture and (event.result == 0 or event.result == -errno.EINPROGRESS),
        )
        return event

    def _exec(self, event: Exec) -> Exec:
        self._enrich_exec(event)
        if event.pid in self.headers:
            self._remember_header(event)
        self._send_up_ancestors(event.pid, event.ppid)
        return event

    def _exit(self, event: Exit) -> Exit:
        self._process_gone(event.pid)
        self.chain_checked.discard(event.pid)
        return event

    # -- what the handlers share --------------------------------------------------------------
    def _send_up_ancestors(self, pid: int, ppid: int) -> None:
        """Exec filter: the pending execs of ``pid``'s ancestors go up before its event, once per
        process, so its tree is known (a GPU opener below a flood of short execs)."""
        if self.exec_filter is None or pid in self.chain_checked:
            return
        if len(self.chain_checked) > CHAIN_CHECKED_MAX:
            self.chain_checked.clear()  # exits not seen (shed): start over, at worst a re-check
        self.chain_checked.add(pid)
        for ancestor in self.exec_filter.promote_chain(ppid or parent_of(pid)):
            self.route(ancestor)

    def _remember_header(self, event: Event) -> None:
        self.headers[event.pid] = ProcessHeader(event.comm, event.uid, event.gid, event.cgroup_id)

    def _confirm_relative_open(self, event: GpuOpen) -> bool:
        """A relative open was classified by basename; keep it only if /proc agrees."""
        is_gpu, target = fd_is_gpu(event.pid, event.fd)
        if target is None:
            return True  # already closed: the kernel's view is all there is
        if not is_gpu:
            self.maps.forget_fd(event.pid, event.fd)
            self.stats.dropped_relative_opens += 1
            return False
        if classify_device_path(target) != DeviceClass.NONE:
            event.path = target
        return True

    def _enrich_exec(self, event: Exec) -> None:
        try:
            with open(f"/proc/{event.pid}/cmdline", "rb") as f:
                raw = f.read(32768)
            event.cmdline = (
                [a.decode("utf-8", "surrogateescape") for a in raw.split(b"\x00")[:-1]]
                if raw
                else []
            )
            with open(f"/proc/{event.pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            ppid = int(fields[1])
        except (OSError, IndexError, ValueError):
            return  # the process already exited: the kernel's fields stand
        gens = self.exit_generations
        if gens is not None and event.exit_gen is not None and gens.of(event.pid) != event.exit_gen:
            event.cmdline = []  # it exited before the read: /proc named another process
            return
        event.ppid = ppid

    # -- a process's end (gpuguard.sources.ebpf.kernel_maps does the map work) ----------------
    def _process_gone(self, tgid: int) -> None:
        """A process exited: report its last counts, then remove its kernel entries."""
        fresh = self.streams.process_gone(tgid)
        if fresh:
            self.maps.forget_fresh(tgid, fresh)
        if self.activity is not None and (
            tgid in self.gpu_tgids or tgid in self.activity.watched_by_user
        ):
            self.activity.forget({tgid}, scan=False)
        if tgid in self.gpu_tgids:
            self.counters.drain_into(self.pending, only_tgid=tgid)
            self.forget_processes({tgid})

    def forget_processes(self, tgids: set[int]) -> int:
        """Remove dead processes' kernel entries and what the sensor kept about them; return
        tracked fds removed."""
        removed = self.maps.forget_processes(tgids)
        self.counters.forget(tgids)
        for tgid in tgids:
            self.gpu_tgids.discard(tgid)
            self.headers.pop(tgid, None)
        return removed
