"""The agent's log: records in, lines out to a destination, never blocking or raising into the caller.

Data flow: ``LogWriter.write(record)`` renders the record
(:class:`~gpuguard.outputs.records.RecordRenderer`) in the caller's thread
and puts the line on a bounded queue; one writer thread takes lines off and
hands them to the sink (:mod:`gpuguard.outputs.log_sinks`).  So a slow
destination (a stalled syslog server, an NFS file) never stalls scoring.
Records the destination lost leave a gap that is marked in-band: the first
record it takes again is a ``recovered`` note naming how many were lost and when.

Details: docs/internals.md, "log_writer".
"""

from __future__ import annotations

import os
import queue
import threading
import time
from typing import Any

from gpuguard.escape import escape_text
from gpuguard.events.agent_events import ActionOutcome, AgentLifecycle
from gpuguard.outputs.bounds import OutputLimits
from gpuguard.outputs.ecs import iso_time
from gpuguard.outputs.finding import Finding
from gpuguard.outputs.log_sinks import (
    DEFAULT_KEEP,
    DEFAULT_MAX_BYTES,
    SEVERITIES,
    FileSink,
    Sink,
    StdoutSink,
    SyslogSink,
)
from gpuguard.outputs.log_spool import DEFAULT_SPOOL_BYTES, Spooled, SpoolFull, SpoolingSink
from gpuguard.outputs.output_format import lifecycle_severity
from gpuguard.outputs.records import FORMATS, Record, RecordRenderer

DEFAULT_QUEUE_SIZE = 4096
MAX_PENDING_FAULTS = 64
FAULT_INTERVAL_S = 60.0  # a flapping destination: at most one fault note per this long
GAP_RETRY_S = 1.0  # an idle writer with an unmarked gap tries its note this often
_STOP = object()


def syslog_severity(record: Record) -> int:
    """malicious -> crit, suspicious -> warning, failed action / agent fault -> err, else info/notice."""
    if isinstance(record, Finding):
        return SEVERITIES[
            {"malicious": "crit", "suspicious": "warning"}.get(record.verdict, "info")
        ]
    if isinstance(record, ActionOutcome):
        return SEVERITIES["err" if record.status == "failed" else "notice"]
    return SEVERITIES[{"high": "err", "medium": "warning"}.get(lifecycle_severity(record), "info")]


class LogWriter:
    """One destination in one format.  ``write`` never raises and never blocks."""

    def __init__(
        self,
        sink: Sink,
        fmt: str = "ecs",
        queue_size: int = DEFAULT_QUEUE_SIZE,
        host: dict[str, Any] | None = None,
        limits: OutputLimits | None = None,
    ) -> None:
        self.sink = sink
        self.renderer = RecordRenderer(fmt, host, limits)
        self.fmt = fmt
        self.destination = sink.name
        self.produced = 0  # records given to write()
        self._sent = 0  # lines the destination took at once
        self.dropped = 0  # records the full queue turned away
        self.errors = 0  # lines the destination failed to take
        self.render_errors = 0  # records that could not be rendered (a bug; counted, not raised)
        self._failing = False
        self._fault_reported_at: float | None = None  # when a run of failures was last reported
        self._run_reported = False  # the current run of failures was reported (so its end is too)
        self._lost_in_run = 0  # records lost in the current run of failures (its stderr note)
        self._lost_in_gap = 0  # records lost since the last note the destination took
        self._gap_since = 0.0  # when the first of those was lost (epoch seconds)
        self._gap_until = 0.0  # when the latest was
        self.gap_notes = 0  # recovered notes the destination took (not records given to write)
        self._late_seen = 0
        # the gap the last datagram handed to the sink named, when it was a note: a refusal
        # reported on the next send is that note's, and reopens its gap (not a record's loss)
        self._note_in_flight: tuple[int, float, float] | None = None
        self._faults: list[AgentLifecycle] = []
        self._lock = threading.Lock()
        self._closed = False
        self._queue: queue.Queue[Any] | None = queue.Queue(queue_size) if queue_size > 0 else None
        self._thread: threading.Thread | None = None
        if self._queue is not None:
            self._thread = threading.Thread(
                target=self._drain, name=f"gpuguard-log-{fmt}", daemon=True
            )
            self._thread.start()

    @property
    def queue_depth(self) -> int:
        return self._queue.qsize() if self._queue is not None else 0

    @property
    def written(self) -> int:
        """Lines the destination took: at once, or later from the spool (an earlier run's excluded)."""
        sink = self.sink
        if isinstance(sink, SpoolingSink):
            return self._sent + max(0, sink.replayed - sink.inherited)
        return self._sent

    @property
    def spooled(self) -> int:
        """This run's lines waiting in the spool for the collector."""
        sink = self.sink
        if isinstance(sink, SpoolingSink):
            return sink.spooled - max(0, sink.inherited - sink.replayed)
        return 0

    def write(self, record: Record) -> bool:
        """Queue ``record``; False when it was dropped (queue full, writer closed, unrenderable)."""
        with self._lock:
            self.produced += 1
        try:
            line = self.renderer.line(record)
            severity = syslog_severity(record)
        # A renderer bug must not take the agent down: it is counted and reported.
        except Exception as exc:  # noqa: BLE001
            with self._lock:
                self.render_errors += 1
            self._fault(
                f"could not render a {type(record).__name__} record: {exc}", {"error": repr(exc)}
            )
            return False
        if self._closed:
            with self._lock:
                self.dropped += 1
            return False
        if self._queue is None:
            self._send(line, severity)
            return True
        try:
            self._queue.put_nowait((line, severity))
        except queue.Full:
            with self._lock:
                self.dropped += 1
            return False
        return True

    def _drain(self) -> None:
        assert self._queue is not None
        poll = getattr(self.sink, "poll", None)
        while True:
            idle_work = poll is not None or self._lost_in_gap
            try:
                item = self._queue.get(timeout=GAP_RETRY_S if idle_work else None)
            except queue.Empty:
                self._poll_spool()  # idle: a spool waiting for its collector is retried
                if self._lost_in_gap:  # the gap marked as soon as it fits, not at the next record
                    self._mark_gap()  # ("works again" waits for a record after it: _recovered)
                continue
            try:
                if item is _STOP:
                    return
                self._send(*item)
            finally:
                self._queue.task_done()

    def _poll_spool(self) -> None:
        sink = self.sink
        if isinstance(sink, SpoolingSink) and sink.spooled and sink.poll():
            self._recovered()

    def _send(self, line: str, severity: int) -> None:
        if self._lost_in_gap and not self._mark_gap(line):
            return  # the gap's note did not fit: this record is lost too, the count carries on
        previous, self._note_in_flight = self._note_in_flight, None
        try:
            self.sink.send(line, severity)
        except Spooled as exc:
            self._failed(exc, lost=False)
        except (OSError, ValueError) as exc:
            self._failed(exc, lost=True)
        else:
            with self._lock:
                self._sent += 1
            self._recovered()
        self._late_losses(previous)

    def _late_losses(self, previous_note: tuple[int, float, float] | None) -> None:
        """Datagrams counted as sent that a refusal reported since showed were lost.  A refusal is
        reported on the send after its datagram's: when that datagram was a gap note
        (``previous_note``), the note is what was lost, and its gap is open again."""
        late = getattr(self.sink, "late_losses", 0)
        if late == self._late_seen:
            return
        with self._lock:
            delta, self._late_seen = late - self._late_seen, late
            if previous_note is not None:
                lost, since, until = previous_note
                self.gap_notes -= 1
                self._gap_since = min(since, self._gap_since) if self._lost_in_gap else since
                self._gap_until = max(until, self._gap_until)
                self._lost_in_gap += lost
                delta -= 1
            if delta > 0:
                self._sent -= delta
                self.errors += delta
                self._lost(delta)

    def _lost(self, count: int) -> None:
        """``count`` records the destination did not take: a gap the next note names (locked)."""
        now = time.time()
        if not self._lost_in_gap:
            self._gap_since = now
        self._gap_until = now
        self._lost_in_gap += count
        self._lost_in_run += count

    def _mark_gap(self, line: str | None = None) -> bool:
        """Write the note naming the gap before anything else; True once the destination took it
        (sent, or kept in order in a spool).  When it did not, ``line`` is lost too and the gap's
        count carries over to the next try: the note is written only where a record of its size
        really fits (a small record in a full disk's last page proves nothing)."""
        with self._lock:
            lost, since, until = self._lost_in_gap, self._gap_since, self._gap_until
        note = self._fault_record(
            f"log destination {self.destination} works again; {lost} records were lost "
            f"from {iso_time(since)} to {iso_time(until)}",
            {
                "recovered": True,
                "lost": lost,
                "lost_since": iso_time(since),
                "lost_until": iso_time(until),
            },
        )
        try:
            rendered = self.renderer.line(note)
        # A renderer bug must not stop the log for good (no note, no record): reported; the
        # records stay counted in errors.
        except Exception as exc:  # noqa: BLE001
            with self._lock:
                self._lost_in_gap -= lost
            self._fault(f"could not render a gap note: {exc}", {"error": repr(exc)})
            return True
        previous, self._note_in_flight = self._note_in_flight, None
        try:
            self.sink.send(rendered, syslog_severity(note))
        except Spooled:
            pass  # in the spool, in order: the collector gets it before what follows
        except (OSError, ValueError) as exc:
            if line is not None:
                self._failed(exc, lost=True)
            self._late_losses(previous)
            return False
        with self._lock:
            self._lost_in_gap -= lost  # a late loss counted meanwhile stays for the next note
            self.gap_notes += 1
        self._late_losses(previous)
        self._note_in_flight = (lost, since, until)
        return True

    def _failed(self, exc: Exception, *, lost: bool) -> None:
        with self._lock:
            if lost:
                self.errors += 1
                self._lost(1)
            first = not self._failing
            self._failing = True
            now = time.monotonic()
            quiet = (
                self._fault_reported_at is not None
                and now - self._fault_reported_at < FAULT_INTERVAL_S
            )
            report = first and not quiet
            if report:
                self._fault_reported_at = now
                self._run_reported = True
        if report:
            reason = getattr(exc, "strerror", None) or str(exc)
            what = (
                "records wait in the spool until it is back"
                if isinstance(exc, (Spooled, SpoolFull))
                else "records are counted as lost until it works again"
            )
            self._fault(
                f"log destination {self.destination} failed: {reason}; {what}",
                {"errno": getattr(exc, "errno", None) or None},
            )

    def _recovered(self) -> None:
        """A run of failures is over: its stderr note, when its start had one (the gap itself
        is marked in the log by :meth:`_mark_gap`, whatever the rate limit on notes)."""
        sink = self.sink
        if isinstance(sink, SpoolingSink) and sink.spooled:
            return  # still sending from the spool: not back yet
        with self._lock:
            if not self._failing or self._lost_in_gap:
                return
            self._failing = False
            lost, self._lost_in_run = self._lost_in_run, 0
            noted, self._run_reported = self._run_reported, False
        if noted:  # a failure that was reported gets its recovery note, with the run's losses
            self._fault(
                f"log destination {self.destination} works again; {lost} records were lost "
                f"while it failed ({self.errors} in all)",
                {"recovered": True, "lost": lost},
            )

    def _fault_record(self, message: str, detail: dict[str, Any]) -> AgentLifecycle:
        """A ``fault`` record about this destination (``message`` escaped)."""
        return AgentLifecycle(
            time=time.time(),
            action="fault",
            message=escape_text(message),
            detail={"destination": self.destination, "format": self.fmt, **detail},
        )

    def _fault(self, message: str, detail: dict[str, Any]) -> None:
        fault = self._fault_record(message, detail)
        with self._lock:
            if len(self._faults) < MAX_PENDING_FAULTS:
                self._faults.append(fault)

    def take_faults(self) -> list[AgentLifecycle]:
        """Faults since the last call (the agent reports them elsewhere: a broken log cannot carry its own fault)."""
        with self._lock:
            faults, self._faults = self._faults, []
        return faults

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until the queue is written out (True) or ``timeout`` passes (False)."""
        if self._queue is None:
            return True
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    def close(self, timeout: float = 5.0) -> None:
        """Write out what is queued (up to ``timeout``), stop the thread, close the destination."""
        if self._closed:
            return
        self._closed = True
        if self._queue is not None and self._thread is not None:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    self._queue.put(_STOP, timeout=max(0.0, deadline - time.monotonic()))
                    break
                except queue.Full:
                    break
            self._thread.join(max(0.0, deadline - time.monotonic()))
        self.sink.close()

    def stats(self) -> dict[str, Any]:
        return {
            "destination": self.destination,
            "format": self.fmt,
            "produced": self.produced,
            "written": self.written,
            "spooled": self.spooled,
            "dropped": self.dropped,
            "errors": self.errors,
            "render_errors": self.render_errors,
            "queue_depth": self.queue_depth,
            "gap_notes": self.gap_notes,
            "unmarked": self._lost_in_gap,
        }


def open_sink(
    destination: str,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    keep: int = DEFAULT_KEEP,
    syslog_format: str = "rfc5424",
    facility: str = "daemon",
    spool_dir: str | None = None,
    spool_max_bytes: int = DEFAULT_SPOOL_BYTES,
) -> Sink:
    """The sink a destination string names (see the module docstring); TCP syslog with
    ``spool_dir`` (and ``spool_max_bytes`` > 0) gets a spool for when the collector is away."""
    if destination in ("-", "stdout"):
        return StdoutSink()
    if destination == "syslog":
        return SyslogSink("unix:/dev/log", syslog_format, facility)
    if destination.startswith("syslog:"):
        sink = SyslogSink(destination[len("syslog:") :], syslog_format, facility)
        if sink.transport == "tcp" and spool_dir and spool_max_bytes > 0:
            try:
                os.makedirs(spool_dir, mode=0o700, exist_ok=True)
            except OSError as exc:
                raise ValueError(
                    f"cannot create the spool directory {spool_dir}: {exc.strerror or exc}"
                ) from None
            name = "".join(c if c.isalnum() or c in ".-" else "_" for c in destination)
            return SpoolingSink(sink, os.path.join(spool_dir, f"{name}.spool"), spool_max_bytes)
        return sink
    if not destination:
        raise ValueError(
            "empty log destination (a file path, -, or syslog[:unix:PATH|udp:HOST:PORT|tcp:HOST:PORT])"
        )
    return FileSink(destination, max_bytes, keep)


def open_log(
    destination: str,
    fmt: str = "ecs",
    *,
    queue_size: int = DEFAULT_QUEUE_SIZE,
    max_bytes: int = DEFAULT_MAX_BYTES,
    keep: int = DEFAULT_KEEP,
    syslog_format: str = "rfc5424",
    facility: str = "daemon",
    host: dict[str, Any] | None = None,
    spool_dir: str | None = None,
    spool_max_bytes: int = DEFAULT_SPOOL_BYTES,
    limits: OutputLimits | None = None,
) -> LogWriter:
    """A :class:`LogWriter` for ``destination`` in ``fmt`` (``ecs``, ``ocsf`` or ``cef``).

    Raises ``ValueError`` for a bad destination, format or option (the agent's
    config check turns it into one clear line); nothing is opened until the
    first record, so an unwritable path is a counted fault, not a start-up crash.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown log format {fmt!r} (one of {', '.join(FORMATS)})")
    sink = open_sink(
        destination,
        max_bytes=max_bytes,
        keep=keep,
        syslog_format=syslog_format,
        facility=facility,
        spool_dir=spool_dir,
        spool_max_bytes=spool_max_bytes,
    )
    return LogWriter(sink, fmt, queue_size, host, limits)
