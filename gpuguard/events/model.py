"""The typed event model every stage after the sensor works with.

Kernel structs (``probes/gpuguard.h``) are decoded into these dataclasses by
``gpuguard.sources.ebpf.sensor``; recordings store them (``events.wire``) and the JSON
lines of ``watch --json`` / ``replay --json`` are their :meth:`Event.to_json`.

``pid`` is always the process id (the kernel's tgid); ``tid`` is the thread.
``time`` is seconds since the Unix epoch (float).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from gpuguard.escape import escape_bytes


@dataclass(slots=True)
class Event:
    """Fields common to every event (the C ``struct gg_header``)."""

    kind: ClassVar[str] = "event"
    time: float
    pid: int
    tid: int = 0
    uid: int = 0
    gid: int = 0
    cgroup_id: int = 0
    comm: str = ""

    def to_json(self) -> dict[str, Any]:
        """The documented JSON object (see README "Event JSON")."""
        out: dict[str, Any] = {"kind": self.kind}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bytes):
                value = escape_bytes(value)
            out[f.name] = value
        return out

    def to_record(self) -> dict[str, Any]:
        """Plain values for the msgpack wire format (bytes stay bytes)."""
        out: dict[str, Any] = {"kind": self.kind}
        for f in dataclasses.fields(self):
            out[f.name] = getattr(self, f.name)
        return out


@dataclass(slots=True)
class GpuOpen(Event):
    kind: ClassVar[str] = "gpu_open"
    path: str = ""
    device_class: str = ""
    fd: int = -1
    flags: int = 0
    relative: bool = False


@dataclass(slots=True)
class GpuIoctl(Event):
    """ioctls on GPU fds counted in the kernel, reported per interval."""

    kind: ClassVar[str] = "gpu_ioctl"
    device_class: str = ""
    command: int = 0
    command_name: str = ""
    count: int = 0


@dataclass(slots=True)
class Connect(Event):
    kind: ClassVar[str] = "connect"
    family: str = ""  # "ipv4" | "ipv6"
    address: str = ""
    port: int = 0
    fd: int = -1
    result: int = 0  # 0 or -errno (-115 = EINPROGRESS)


@dataclass(slots=True)
class NetPayload(Event):
    kind: ClassVar[str] = "net_payload"
    fd: int = -1
    seq: int = 0
    protocol: str = "unknown"
    detail: dict[str, Any] = field(default_factory=dict)
    data: bytes = b""
    truncated: bool = False


@dataclass(slots=True)
class Exec(Event):
    kind: ClassVar[str] = "exec"
    filename: str = ""
    ppid: int = 0
    cmdline: list[str] = field(default_factory=list)
    exit_gen: int | None = None  # the pid's exit generation at the exec (None: not known)


@dataclass(slots=True)
class Exit(Event):
    kind: ClassVar[str] = "exit"
    exit_code: int = -1


@dataclass(slots=True)
class Lost(Event):
    """Events the kernel could not deliver, by what was lost."""

    kind: ClassVar[str] = "lost"
    what: str = ""
    count: int = 0


@dataclass(slots=True)
class ConnActivity(Event):
    """What a watched process (a GPU holder) did on one connection so far (``struct gg_conn_activity``).

    Reported on an interval while the connection lives; ``small_write_times`` are the
    times (seconds since the epoch) of its latest small writes (<= 1 KiB), oldest first.
    ``gpuguard scan`` builds the same record from tcp_info snapshots taken once a second
    (``gpuguard.sources.net.session_window``): there the first fields cover its window only.
    """

    kind: ClassVar[str] = "conn_activity"
    fd: int = -1
    age_s: float = 0.0  # since the connect (or since watching began, when ``seeded``)
    bytes_out: int = 0
    writes_out: int = 0
    small_writes: int = 0
    small_write_times: list[float] = field(default_factory=list)
    idle_s: float = 0.0  # since its latest write
    seeded: bool = False  # watching began after the connect: the age is a lower bound
    # From the TCP stack's own counters (tcp_info, totals since the connect); None: not read or not in this kernel.
    remote: str = ""  # "127.0.0.1:443", "[::1]:443"
    bytes_in: int | None = None
    data_segs_in: int | None = None
    stack_bytes_out: int | None = (
        None  # bytes out as the stack counts them (cross-checks bytes_out)
    )
    data_segs_out: int | None = None
    last_recv_s: float | None = None  # since its latest data in
    rtt_ms: float | None = None
    time_resolution_s: float = (
        0.0  # 0: kernel timestamps; 1.0: write times seen by scan's once-a-second snapshots
    )


@dataclass(slots=True)
class HugeAlloc(Event):
    """A huge-page allocation asked for (``struct gg_huge_alloc``): mmap(MAP_HUGETLB) or
    shmget(SHM_HUGETLB), seen at syscall entry, so also when the kernel refused it."""

    kind: ClassVar[str] = "huge_alloc"
    source: str = ""  # "mmap" | "shmget"
    length: int = 0  # bytes asked for
    page_size: int = 0  # bytes per page: the size asked for, or the host's default huge page size
    flags: int = 0  # mmap flags / shmflg as passed


@dataclass(slots=True)
class CpuActivity(Event):
    """How a process holds the CPU (``gpuguard.sources.proc.cpu_usage``, /proc/PID/task/*/schedstat)
    and, where the FPU probe runs, its SSE rounding modes at context switches (probes/fpu.bpf.c).

    A thread is *spinning* when it was runnable (on a CPU or waiting in the run queue for one)
    for at least 90 % of the span measured: its lifetime, or the agent's sampling interval.
    Nice 19, a thread cap or a busy host lower what it gets to run, not how runnable it is.
    """

    kind: ClassVar[str] = "cpu_activity"
    threads: int = 0  # threads read
    spinning_threads: int = 0
    spin_span_s: float = 0.0  # the longest span over which one of them was measured spinning
    runnable_max: float = 0.0  # the highest runnable fraction of one thread (0-1)
    ran_share: float | None = None  # of the spinning threads' runnable time, the share on a CPU
    # FPU probe (None: not watched here); totals since the probe first saw one of its threads
    # leave round-to-nearest (gpuguard/events/rounding_modes.py reads the pattern)
    fpu_samples: int | None = None  # context switches looked at (at most one per ms per thread)
    fpu_round_nondefault: int | None = None  # ... with a rounding mode other than nearest
    fpu_round_changes: int | None = None  # ... with a mode unlike the thread's previous look
    fpu_span_s: float = 0.0  # first to latest look
    fpu_modes: list[int] = field(default_factory=list)  # looks per mode: nearest, down, up, zero
    fpu_transitions: list[int] = field(default_factory=list)  # 16: previous mode * 4 + next
    fpu_sleeps: int = 0  # looks at a switch-out because the thread blocked
    fpu_stops: int = 0  # ... because it was stopped from outside (SIGSTOP, ptrace, freezer)
    fpu_threads: int = 0  # threads seen leaving round-to-nearest
    fpu_sleepless_threads: int = 0  # ... never found asleep over enough looks (fpu_probe.py)


EVENT_TYPES: dict[str, type[Event]] = {
    cls.kind: cls
    for cls in (
        GpuOpen,
        GpuIoctl,
        Connect,
        NetPayload,
        Exec,
        Exit,
        Lost,
        ConnActivity,
        HugeAlloc,
        CpuActivity,
    )
}
