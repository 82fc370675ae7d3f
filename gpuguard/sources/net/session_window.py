"""Session evidence for ``gpuguard scan``: tcp_info of GPU holders' connections, once a second.

Data flow: while scan's window runs, :meth:`SessionWindow.sample` reads the
TCP counters of the watched pids' sockets (:class:`~gpuguard.sources.net.tcp_sessions.TcpSessionReader`)
-> a series per (pid, fd) -> :meth:`SessionWindow.records` turns each series into
the same :class:`~gpuguard.events.model.ConnActivity` the agent's kernel records
give, so the same signals and rules apply.

A snapshot in which a connection's ``data_segs_out`` grew marks a write at that
snapshot's time (1 s resolution, ``time_resolution_s``); it is a small write when
the bytes sent since the previous snapshot average <= 1 KiB a segment.  Three such
times (two intervals) make a cadence for these records, so the default 3 s window
cannot show a 15-60 s pool cadence and ``--gpu-window 60`` can.  ``bytes_out``/``writes_out``/
``small_writes`` cover the window (the record is ``seeded``: its age is the window);
the stack's own fields (bytes and segments each way, time since the latest data
in) are totals since the connect.  Scan cannot see the connection's real age,
writes between two snapshots apart, nor connections opened and closed between
two snapshots.

:func:`one_look` is the same evidence without a window, for every process that scored anything
and holds an established TCP connection: one tcp_info read of its sockets, each turned into a
record of totals since the connect (segments and bytes each way, time since the latest data
in).  Its age is the process's, since the connect time is not kept by the stack: the
connection cannot be older, so rates over it are lower bounds; whether records are small
both ways comes from bytes per segment, which needs no age.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from gpuguard.events.model import ConnActivity
from gpuguard.sources.net.conn_activity import stack_fields
from gpuguard.sources.net.tcp_sessions import TcpSession, TcpSessionReader, read_sessions

SMALL_WRITE_BYTES = 1024
MAX_WRITE_TIMES = 64


@dataclass(slots=True)
class SessionWindow:
    """TCP counters of the watched pids, one snapshot per :meth:`sample` call."""

    pids: set[int] = field(default_factory=set)
    series: dict[tuple[int, int], list[tuple[float, TcpSession]]] = field(default_factory=dict)
    unreadable: set[str] = field(default_factory=set)
    reader: TcpSessionReader = field(default_factory=TcpSessionReader)

    def sample(self, now: float | None = None) -> None:
        if not self.pids:
            return
        now = time.time() if now is None else now
        dump = self.reader.read(sorted(self.pids))
        self.unreadable.update(dump.unreadable)
        for key, session in dump.sessions.items():
            if (
                session.data_segs_out is None
            ):  # kernels before 4.6: no segment counts, no write times
                continue
            self.series.setdefault(key, []).append((now, session))

    def records(self, header_of) -> list[ConnActivity]:
        """One record per connection seen at least twice; ``header_of(pid)`` gives (comm, uid)."""
        out: list[ConnActivity] = []
        for (pid, fd), points in sorted(self.series.items()):
            if len(points) < 2:
                continue
            out.append(_record(pid, fd, points, *header_of(pid)))
        return out


def _sent(session: TcpSession) -> int:
    return session.bytes_sent if session.bytes_sent is not None else (session.bytes_acked or 0)


def _record(
    pid: int, fd: int, points: list[tuple[float, TcpSession]], comm: str, uid: int
) -> ConnActivity:
    writes: list[float] = []
    small: list[float] = []
    for (_t0, before), (t1, after) in zip(points, points[1:], strict=False):
        segs = after.data_segs_out - before.data_segs_out
        if segs <= 0:
            continue
        writes.append(t1)
        if (_sent(after) - _sent(before)) / segs <= SMALL_WRITE_BYTES:
            small.append(t1)
    first_t, first = points[0]
    last_t, last = points[-1]
    idle = last_t - writes[-1] if writes else (last.last_data_sent_ms or 0) / 1000
    return ConnActivity(
        time=last_t,
        pid=pid,
        uid=uid,
        comm=comm,
        fd=fd,
        age_s=round(last_t - first_t, 3),
        bytes_out=_sent(last) - _sent(first),
        writes_out=last.data_segs_out - first.data_segs_out,
        small_writes=len(small),
        small_write_times=[round(t, 3) for t in small[-MAX_WRITE_TIMES:]],
        idle_s=round(idle, 3),
        seeded=True,
        time_resolution_s=1.0,
        **stack_fields(last),
    )


def one_look(
    pids, header_of, age_of, now: float | None = None, proc_root: str = "/proc"
) -> tuple[list[ConnActivity], list[str]]:
    """One record per established TCP connection of ``pids`` from a single tcp_info read, and the
    lines for what could not be read.  ``header_of(pid)`` gives (comm, uid); ``age_of(pid)``
    the process's age in seconds (the record's age: an upper bound of the connection's)."""
    now = time.time() if now is None else now
    dump = read_sessions(sorted(pids), proc_root)
    out: list[ConnActivity] = []
    for (pid, fd), session in sorted(dump.sessions.items()):
        if session.state != "ESTABLISHED" or session.data_segs_out is None:
            continue  # listening or closing; kernels before 4.6 have no segment counts
        sent, segments = _sent(session), session.data_segs_out
        small = segments if segments and sent / segments <= SMALL_WRITE_BYTES else 0
        idle = (session.last_data_sent_ms or 0) / 1000
        comm, uid = header_of(pid)
        out.append(
            ConnActivity(
                time=now,
                pid=pid,
                fd=fd,
                age_s=round(max(age_of(pid), idle, 0.0), 3),
                bytes_out=sent,
                writes_out=segments,
                small_writes=small,
                idle_s=round(idle, 3),
                time_resolution_s=1.0,
                comm=comm,
                uid=uid,
                **stack_fields(session),
            )
        )
    return out, dump.unreadable
