"""The agent's log: records in, lines out to a destination, never blocking or raising into the caller.

Data flow: ``LogWriter.write(record)`` renders the record
(:class:`~gpuguard.outputs.records.RecordRenderer`) in the caller's thread
and puts the line on a bounded queue; one writer thread takes lines off and
hands them to the sink (:mod:`gpuguard.outputs.log_sinks`).  So a slow
destination (a stalled syslog server, an NFS file) never stalls scoring:

* queue full -> the record is dropped and counted (``dropped``);
* the sink fails (full disk, closed stdout pipe, syslog gone) -> the line is
  lost and counted (``errors``), and the first failure of a run of failures
  becomes an :class:`~gpuguard.events.agent_events.AgentLifecycle` "fault"
  that :meth:`LogWriter.take_faults` hands to the agent (to report on its
  other outputs, in ``status`` and in a metric); the sink is retried on the
  next line, and a "recovered" note follows when it works again.

``queue_size=0`` writes synchronously in the caller's thread (same counting,
same no-raise guarantee).

Destinations (:func:`open_log`): ``-`` or ``stdout``; ``syslog`` (``/dev/log``),
``syslog:unix:PATH``, ``syslog:udp:HOST:PORT``, ``syslog:tcp:HOST:PORT``;
anything else is a file path.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

from gpuguard.escape import escape_text
from gpuguard.events.agent_events import ActionOutcome, AgentLifecycle
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
from gpuguard.outputs.records import FORMATS, Record, RecordRenderer, lifecycle_severity

DEFAULT_QUEUE_SIZE = 4096
MAX_PENDING_FAULTS = 64
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
    ) -> None:
        self.sink = sink
        self.renderer = RecordRenderer(fmt, host)
        self.fmt = fmt
        self.destination = sink.name
        self.written = 0
        self.dropped = 0  # records the full queue turned away
        self.errors = 0  # lines the destination failed to take
        self.render_errors = 0  # records that could not be rendered (a bug; counted, not raised)
        self._failing = False
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

    def write(self, record: Record) -> bool:
        """Queue ``record``; False when it was dropped (queue full, writer closed, unrenderable)."""
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
        while True:
            item = self._queue.get()
            try:
                if item is _STOP:
                    return
                self._send(*item)
            finally:
                self._queue.task_done()

    def _send(self, line: str, severity: int) -> None:
        try:
            self.sink.send(line, severity)
        except (OSError, ValueError) as exc:
            with self._lock:
                self.errors += 1
                first = not self._failing
                self._failing = True
            if first:
                reason = getattr(exc, "strerror", None) or str(exc)
                self._fault(
                    f"log destination {self.destination} failed: {reason}; "
                    "records are counted as lost until it works again",
                    {"errno": getattr(exc, "errno", None)},
                )
            return
        with self._lock:
            self.written += 1
            recovered = self._failing
            self._failing = False
        if recovered:
            self._fault(
                f"log destination {self.destination} works again after {self.errors} lost records",
                {"recovered": True},
            )

    def _fault(self, message: str, detail: dict[str, Any]) -> None:
        fault = AgentLifecycle(
            time=time.time(),
            action="fault",
            message=escape_text(message),
            detail={"destination": self.destination, "format": self.fmt, **detail},
        )
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
            "written": self.written,
            "dropped": self.dropped,
            "errors": self.errors,
            "render_errors": self.render_errors,
            "queue_depth": self.queue_depth,
        }


def open_sink(
    destination: str,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    keep: int = DEFAULT_KEEP,
    syslog_format: str = "rfc5424",
    facility: str = "daemon",
) -> Sink:
    """The sink a destination string names (see the module docstring)."""
    if destination in ("-", "stdout"):
        return StdoutSink()
    if destination == "syslog":
        return SyslogSink("unix:/dev/log", syslog_format, facility)
    if destination.startswith("syslog:"):
        return SyslogSink(destination[len("syslog:") :], syslog_format, facility)
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
) -> LogWriter:
    """A :class:`LogWriter` for ``destination`` in ``fmt`` (``ecs``, ``ocsf`` or ``cef``).

    Raises ``ValueError`` for a bad destination, format or option (the agent's
    config check turns it into one clear line); nothing is opened until the
    first record, so an unwritable path is a counted fault, not a start-up crash.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown log format {fmt!r} (one of {', '.join(FORMATS)})")
    sink = open_sink(
        destination, max_bytes=max_bytes, keep=keep, syslog_format=syslog_format, facility=facility
    )
    return LogWriter(sink, fmt, queue_size, host)
