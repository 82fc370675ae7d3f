"""The eBPF GPU sensor: loads the probes with bcc and yields typed events.

One :class:`Sensor` owns the loaded program.  :meth:`Sensor.poll` returns the
events that arrived since the last call: kernel events from the ring buffer
(perf buffer on kernels without one), ioctl counters drained from the kernel
every ``drain_interval`` seconds as ``gpu_ioctl`` deltas, and ``lost`` events
whenever a kernel counter says something could not be delivered.

The sensor also keeps the kernel maps honest: entries of processes that exit
are removed after a final drain, and a periodic sweep drops descriptors that
were closed without close(2) (close_range, close-on-exec, fd passing).
Each decoded record goes through ``event_route`` (a table from event type to its handler).
Compiling and attaching live in ``probe_load``, the counter drains in ``counter_drain``,
reassembly of captured first writes in ``payload_streams``, the per-connection activity
records of GPU holders in ``conn_activity`` (their kernel side in ``activity_map``).
"""

from __future__ import annotations

import ctypes as ct
import math
import os
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field, replace

from gpuguard.errors import GpuguardError
from gpuguard.events.abi import EventKind, ExecInterest
from gpuguard.events.model import Event, Lost
from gpuguard.sources.ebpf import preflight
from gpuguard.sources.ebpf.activity_map import ActivityMap
from gpuguard.sources.ebpf.bpf_decode import EventDecoder, MalformedEvent
from gpuguard.sources.ebpf.counter_drain import CounterDrain
from gpuguard.sources.ebpf.event_route import EventRouter, ProcessHeader
from gpuguard.sources.ebpf.exec_filter import ExecFilter
from gpuguard.sources.ebpf.exit_gens import ExitGenTable
from gpuguard.sources.ebpf.fpu_probe import FpuProbe
from gpuguard.sources.ebpf.kernel_headers import HeaderSource
from gpuguard.sources.ebpf.kernel_maps import SLOT_MULTI, KernelMaps  # noqa: F401 (SLOT_MULTI: tests read it here)
from gpuguard.sources.ebpf.probe_load import (
    ProbeDetach,
    attach_probes,
    kernel_has_ringbuf,
    load_failure,
    load_sensor_probes,
)
from gpuguard.sources.ebpf.probe_source import ProbeSettings
from gpuguard.sources.ebpf.ring_wait import UNWAKEABLE_MAX_MS, RingWait
from gpuguard.sources.net.conn_activity import ConnActivityReader
from gpuguard.sources.net.payload_streams import PayloadStreams
from gpuguard.sources.proc.gpu_fds import fd_is_gpu

_SCHEMA_MAPS = {
    EventKind.GPU_OPEN: "schema_gpu_open",
    EventKind.CONNECT: "schema_connect",
    EventKind.NET_PAYLOAD: "schema_net_payload",
    EventKind.EXEC: "schema_exec",
    EventKind.EXIT: "schema_exit",
    EventKind.HUGE_ALLOC: "schema_huge_alloc",
}
_TABLES = (
    "tracked_fds",
    "ioctl_counts",
    "fresh_sockets",
    "lost_counts",
    "gpu_fd_slots",
    "sock_fd_slots",
    "map_writes",
)
DRAIN_BUDGET_S = 0.5  # the final drain reads what it can in this time, then the process stops
# With no GPU process known the drain has only the lost counts (and every 2 s at most the exec
# filter's counts) to read: this often at most.  A kept exec wakes the sensor by itself
# (exec_wake), so an idle sensor sleeps until its next periodic job.
IDLE_DRAIN_S = 5.0


@dataclass(slots=True)
class SensorStats:
    events: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    lost: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    malformed: int = 0  # kernel records that did not decode
    wakes: int = 0  # the kernel's wake-ups: the exec filter kept an exec while the sensor slept
    routing_errors: int = 0  # decoded records our own routing failed on (a gpuguard bug)
    dropped_relative_opens: int = 0
    swept_fds: int = 0
    tcp_counters_unreadable: int = (
        0  # network namespaces whose TCP counters (tcp_info) could not be read
    )
    watch_refused: int = 0  # request_watch calls the kernel's watched_tgids map had no room for
    interest_refused: int = 0  # request_interest calls the kernel's exec_interest map refused
    startup_seconds: float = 0.0
    probe_cache: str = ""  # "loaded" (from the probe cache) or "compiled" (by bcc, at start)
    buffer: str = ""


class Sensor:
    """Loads the probes, then turns kernel records into model events."""

    def __init__(
        self,
        settings: ProbeSettings | None = None,
        *,
        drain_interval: float = 1.0,
        sweep_interval: float = 10.0,
        activity_interval: float = 10.0,
        fpu: bool = False,
        exec_names: list[str] | tuple[str, ...] = (),
        ignore_tgid: int | None = None,
    ) -> None:
        self.settings = settings or ProbeSettings()
        self.ignore_tgid = (
            ignore_tgid  # a process whose opens the probes do not look at (the agent)
        )
        self.drain_interval = drain_interval
        self.sweep_interval = sweep_interval
        self.stats = SensorStats()
        self._bpf = None
        self._bcc = None
        self._detach: ProbeDetach | None = None  # probes being detached (detach_probes)
        self.tables: dict = {}
        self.exit_generations: ExitGenTable | None = None  # the probes' exit_gens, once started
        self.maps: KernelMaps | None = None  # stale-entry removal in the probes' maps
        self._decoder: EventDecoder | None = None
        self.counters: CounterDrain | None = None  # ioctl and lost counters, once started
        self._pending: list[Event] = []
        self._watch_requests: deque[int] = deque()  # request_watch, from other threads
        self._headers: dict[int, ProcessHeader] = {}
        self._gpu_tgids: set[int] = set()
        self.streams = PayloadStreams(self.settings.payload_writes)  # first writes per connection
        self._next_drain = 0.0
        self._next_sweep = 0.0
        # The ring-buffer callback ends the current poll once this time passes:
        # a stop request sets it to 0, the final drain to a short budget, so an
        # event flood cannot keep a stopping process reading forever.
        self._consume_until = math.inf
        self.activity_interval = activity_interval
        self.activity: ConnActivityReader | None = None  # per-connection records of GPU holders
        self.fpu_wanted = fpu  # load the RandomX rounding-mode probe (the agent reads it)
        self.headers: HeaderSource | None = None  # what the probes compiled against, once started
        self.fpu: FpuProbe | None = None  # RandomX rounding modes; .blind_spot when not loaded
        # The exec filter (settings.exec_filter): program names whose execs go up in full
        self.exec_names = list(exec_names)
        self.exec_filter: ExecFilter | None = None
        self._interest_requests: deque[int] = deque()  # request_interest, from other threads
        self.router: EventRouter | None = None  # each decoded record's handler, once started
        self._route = _not_started  # router.route once started (tests put a broken one here)
        self._ring_wait: RingWait | None = None  # a wait other threads can end (ring buffers)
        self.cache_note: str | None = None  # a probe cache that could not be read or written

    # -- lifecycle -----------------------------------------------------------------
    def start(self) -> None:
        bcc = self._bcc = preflight.check_sensor_prerequisites()
        if not self.settings.perf_buffer and not kernel_has_ringbuf():
            self.settings = replace(self.settings, perf_buffer=True)
        started = time.perf_counter()
        try:
            loaded = load_sensor_probes(bcc, self.settings.cflags())
            self._bpf, self.headers = loaded.bpf, loaded.headers
            self.stats.probe_cache = "loaded" if loaded.cached else "compiled"
            self.cache_note = loaded.note
            if self.ignore_tgid is not None:
                self._bpf[b"ignore_tgid"][ct.c_int(0)] = ct.c_uint32(self.ignore_tgid)
            attach_probes(bcc, self._bpf, self.settings.enter_hook)
        except Exception as exc:  # noqa: BLE001 - bcc raises bare Exception for compile/load/attach errors
            raise load_failure(exc) from None
        self.tables = {name: self._bpf[name.encode()] for name in _TABLES}
        self.exit_generations = ExitGenTable(self._bpf[b"exit_gens"])
        self.maps = KernelMaps(self.tables, self.settings.fd_slots)
        if self.settings.payload_capture:
            self.activity = ConnActivityReader(
                ActivityMap(self._bpf, self.settings.fd_slots, self.settings.activity_slots),
                self.activity_interval,
            )
        header = self._bpf[b"schema_header"].Leaf
        classes = {kind: self._bpf[name.encode()].Leaf for kind, name in _SCHEMA_MAPS.items()}
        classes[EventKind.WAKE] = header  # a header alone
        self._decoder = EventDecoder(classes, header)
        if self.settings.exec_filter:
            self.exec_filter = ExecFilter(self._bpf, self._decoder.exec_record)
            self.exec_filter.set_names(self.exec_names)
        self.counters = CounterDrain(
            self.tables,
            self.maps,
            self.stats,
            self._gpu_tgids,
            self._header_fields,
            self.exec_filter,
        )
        self.router = EventRouter(
            stats=self.stats,
            pending=self._pending,
            headers=self._headers,
            gpu_tgids=self._gpu_tgids,
            maps=self.maps,
            counters=self.counters,
            streams=self.streams,
            payload_capture=self.settings.payload_capture,
            activity=self.activity,
            exec_filter=self.exec_filter,
            exit_generations=self.exit_generations,
        )
        self._route = self.router.route
        events = self._bpf[b"events"]
        if self.settings.perf_buffer:
            events.open_perf_buffer(
                self._on_perf,
                page_cnt=max(8, self.settings.ringbuf_pages // 8),
                lost_cb=self._on_perf_lost,
            )
            self.stats.buffer = "perf"
        else:
            events.open_ring_buffer(self._on_ring)
            self.stats.buffer = "ring"
            self._ring_wait = RingWait.open(self._bpf)
        self.stats.startup_seconds = time.perf_counter() - started
        if self.fpu_wanted:  # a separate program: one that cannot load blinds only itself
            self.fpu = FpuProbe.open(bcc)
        now = time.monotonic()
        self._next_drain = now + self.drain_interval
        self._next_sweep = now + self.sweep_interval

    def loaded(self) -> str:
        """How the probes were loaded, for a start-up line: the time and the kernel headers."""
        kind = self.headers.kind if self.headers is not None else "no"
        how = "from the probe cache, compiled" if self.stats.probe_cache == "loaded" else "compiled"
        line = f"probes loaded in {self.stats.startup_seconds:.2f} s ({how} with {kind} kernel headers)"
        return f"{line}; probe cache: {self.cache_note}" if self.cache_note else line

    def detach_probes(self) -> None:
        """Start detaching every probe and return at once: no new events arrive,
        what is buffered and the counters stay readable (call before the final
        drain, so the kernel's detach time overlaps it).  close() finishes it."""
        if self._bpf is not None and self._detach is None:
            self._detach = ProbeDetach(self._bcc, self._bpf)

    def close(self) -> None:
        if self.fpu is not None:
            self.fpu.close()
        if self._ring_wait is not None:
            self._ring_wait.close()
        if self._bpf is not None:
            self.detach_probes()
            self._detach.wait()
            failures, self._detach = self._detach.failures, None
            self._bpf.cleanup()  # the rest: buffers, programs, maps
            self._bpf = None
            if failures:
                raise OSError(f"closing {len(failures)} probe fds failed: {failures}")

    def __enter__(self) -> Sensor:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- polling -------------------------------------------------------------------
    def poll(self, timeout_ms: int = 100) -> list[Event]:
        """Events since the last call; drains counters when their interval is due.

        ``timeout_ms`` is the longest wait for a record: the wait ends sooner when periodic
        work falls due (:meth:`wait_ms`), so a caller may pass a long one on a quiet host."""
        if self._bpf is None:
            raise GpuguardError("the sensor is not started", "call Sensor.start() first")
        timeout_ms = self.wait_ms(timeout_ms)
        if self._ring_wait is not None:
            self._ring_wait.wait_and_read(timeout_ms)
        elif self.settings.perf_buffer:
            self._bpf.perf_buffer_poll(timeout=min(timeout_ms, UNWAKEABLE_MAX_MS))
        else:
            self._bpf.ring_buffer_poll(timeout=min(timeout_ms, UNWAKEABLE_MAX_MS))
        while self._watch_requests:
            tgid = self._watch_requests.popleft()
            if os.path.exists(f"/proc/{tgid}"):
                try:
                    self.watch_process(tgid)
                except Exception:  # noqa: BLE001 - bcc raises a bare Exception when the map is full
                    self.stats.watch_refused += 1
        now = time.monotonic()
        if self.exec_filter is not None:
            self._exec_filter_turn(now)
        if now >= self._next_drain:
            idle = self.counters.idle
            self._next_drain = now + (
                max(self.drain_interval, IDLE_DRAIN_S) if idle else self.drain_interval
            )
            self._consume_buffer()  # opens before counts, so counts know their process
            self.counters.drain_into(self._pending)
        if self.activity is not None and self.activity.due(now):
            self._pending.extend(self.activity.report(self._header_fields))
            self.stats.tcp_counters_unreadable += len(self.activity.unreadable)
        if now >= self._next_sweep:
            self._next_sweep = now + self.sweep_interval
            self.sweep()
        out = self._pending.copy()  # the router appends to this one list
        self._pending.clear()
        return out

    def wait_ms(self, most_ms: int) -> int:
        """How long the next poll may wait for a record: until the first periodic job due
        (the drain, the activity report, the sweep, and the exec filter's turn while execs may
        be pending), at most ``most_ms``.  Each wake-up costs ~0.1 ms of CPU on a VM, so a quiet
        host's sensor wakes about once a second, not four times."""
        if self._watch_requests or self._interest_requests:
            return 0
        due = min(self._next_drain, self._next_sweep)
        if self.activity is not None:
            due = min(due, self.activity.next_due)
        filt = self.exec_filter
        if filt is not None and filt.may_hold_execs:
            due = min(due, filt.next_turn)
        return max(0, min(most_ms, math.ceil((due - time.monotonic()) * 1000)))

    def _exec_filter_turn(self, now: float) -> None:
        """Marks asked for, then the pending execs of processes that lived past the filter's age."""
        filt = self.exec_filter
        while self._interest_requests:
            try:
                filt.mark(self._interest_requests.popleft(), ExecInterest.USER)
            except Exception:  # noqa: BLE001 - bcc raises a bare Exception on a failed update
                self.stats.interest_refused += 1
        if filt.due(now):
            for event in filt.take_old():
                self._route(event)

    def set_exec_names(self, names: list[str]) -> int:
        """Replace the program names whose execs go up in full (a rule reload)."""
        self.exec_names = list(names)
        return self.exec_filter.set_names(self.exec_names) if self.exec_filter else 0

    def request_interest(self, tgid: int, wake: bool = True) -> None:
        """Ask, from any thread, for every later exec of ``tgid`` and its tree in full
        (``wake=False``: the polling thread itself asks, and polls next)."""
        if self.exec_filter is not None:
            self._interest_requests.append(tgid)
            if wake:
                self.wake()

    def request_stop(self) -> None:
        """End the current poll between two records, or its wait (safe from a signal handler)."""
        self._consume_until = 0.0
        self.wake()

    def wake(self) -> None:
        """End the current wait for records now (from any thread): a request is waiting."""
        if self._ring_wait is not None:
            self._ring_wait.wake()

    def watch_process(self, tgid: int) -> int:
        """Give a process's connections activity records (GPU holders get them already); returns
        how many existing connections were seeded.  For processes scored above a threshold.
        From the thread that polls; other threads use :meth:`request_watch`."""
        return self.activity.watch(tgid) if self.activity is not None else 0

    def request_watch(self, tgid: int, wake: bool = True) -> None:
        """Ask for :meth:`watch_process` from any thread; the next poll carries it out
        (``wake=False``: the polling thread itself asks, and polls next)."""
        self._watch_requests.append(tgid)
        if wake:
            self.wake()

    def _header_fields(self, tgid: int) -> tuple[str, int, int, int]:
        header = self._headers.get(tgid)
        if header is None:
            return _comm_of(tgid), 0, 0, 0
        return header.comm, header.uid, header.gid, header.cgroup_id

    def drain(self) -> list[Event]:
        """Read what is buffered (for at most DRAIN_BUDGET_S) and every counter now (e.g. before stopping)."""
        stopping = self._consume_until
        self._consume_until = time.monotonic() + DRAIN_BUDGET_S
        try:
            self._consume_buffer()
        finally:
            self._consume_until = stopping
        self.counters.every_counter_now()
        self.counters.drain_into(self._pending)
        if self.activity is not None:
            self._pending.extend(self.activity.report(self._header_fields))
            self.stats.tcp_counters_unreadable += len(self.activity.unreadable)
        out = self._pending.copy()  # the router appends to this one list
        self._pending.clear()
        return out

    def _consume_buffer(self) -> None:
        if self.settings.perf_buffer:
            self._bpf.perf_buffer_poll(timeout=0)
        else:
            self._bpf.ring_buffer_consume()

    # -- buffer callbacks (must never raise: ctypes would print and swallow) --------
    def _on_ring(self, _ctx, data, size) -> int:
        self._handle(data, size)
        # A negative return makes libbpf stop consuming after this record.
        return -1 if time.monotonic() >= self._consume_until else 0

    def _on_perf(self, _cpu, data, size) -> None:
        self._handle(data, size)

    def _on_perf_lost(self, count) -> None:
        self.stats.lost["perf-buffer"] += count
        self._pending.append(Lost(time=time.time(), pid=0, what="perf-buffer", count=int(count)))

    def _handle(self, data, size) -> None:
        try:
            event = self._decoder.decode(data, size)
        except MalformedEvent:
            self.stats.malformed += 1
            return
        if event is None:  # the exec filter kept an exec while the map was known empty
            self.stats.wakes += 1
            if self.exec_filter is not None:
                self.exec_filter.woken()  # its next turn, at that exec's age, walks the map
            return
        try:
            self._route(event)
        except Exception:  # noqa: BLE001 - one bad record must not stop the sensor
            self.stats.routing_errors += 1  # the record was fine; the bug is ours

    # -- map hygiene (gpuguard.sources.ebpf.kernel_maps does the map work) --------------------
    def sweep(self) -> None:
        """Drop entries of processes that died unseen and fds closed without close(2)."""
        dead, swept = self.maps.sweep(fd_is_gpu)
        self.stats.swept_fds += swept
        if dead:
            self.stats.swept_fds += self.router.forget_processes(dead)
        if self.activity is not None:
            self.activity.sweep()


def _comm_of(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm", "rb") as f:
            return f.read().rstrip(b"\n").decode("utf-8", "surrogateescape")
    except OSError:
        return ""


def _not_started(event: Event) -> None:
    raise GpuguardError("the sensor is not started", "call Sensor.start() first")
