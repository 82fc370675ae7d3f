"""The agent's log: one JSON line per finding, action and lifecycle event, written off the detect loop.

:func:`render_record` is the one place a record becomes a line (ECS by
default, reusing ``scan --json``'s mapping in :mod:`gpuguard.outputs.ecs`; OCSF
through :mod:`gpuguard.outputs.ocsf`).  :class:`LogWriter` owns the
destination on its own thread behind a bounded queue, so a slow disk or a
stalled pipe never stalls detection: lines that do not fit are dropped and
counted.  A write that fails (a full disk, a closed stdout) is counted and
reported on stderr once per kind of error; the agent keeps scoring and the
writer keeps trying (a disk that frees up is written to again).
"""

from __future__ import annotations

import errno
import os
import sys
import threading
import time
from typing import Any, Callable

from gpuguard.agent.counters import AgentCounters
from gpuguard.agent.intake import BoundedQueue
from gpuguard.errors import GpuguardError
from gpuguard.escape import escape_text
from gpuguard.events.agent_events import ActionOutcome, AgentLifecycle
from gpuguard.outputs.ecs import ECS_VERSION, finding_to_ecs, host_fields, iso_time
from gpuguard.outputs.finding import Finding
from gpuguard.outputs.jsonl import dumps_line
from gpuguard.outputs.ocsf import finding_to_ocsf

DATASET = "gpuguard.agent"
RENDERED_FORMATS = ("ecs", "ocsf")
ALERT_VERDICTS = ("suspicious", "malicious")


def check_format(fmt: str) -> None:
    if fmt not in RENDERED_FORMATS:
        raise GpuguardError(f"log format {fmt!r} is not available in this build",
                            f"use one of {', '.join(RENDERED_FORMATS)}")


def render_record(record: Finding | ActionOutcome | AgentLifecycle, fmt: str, host: dict[str, Any],
                  when: float) -> str:
    """One log line (no newline) for a finding, an action outcome or a lifecycle event."""
    if isinstance(record, Finding):
        if fmt == "ocsf":
            return dumps_line(finding_to_ocsf(record, when, host.get("hostname")))
        doc = finding_to_ecs(record, when, host, dataset=DATASET)
        # Only a suspicious or malicious verdict pages anyone; the rest is an event.
        doc["event"]["kind"] = "alert" if record.verdict in ALERT_VERDICTS else "event"
        doc["event"]["action"] = f"verdict-{record.verdict}"
        return dumps_line(doc)
    body = record.to_json()
    kind = body.pop("kind")
    message = (f"{record.action} {record.status} pid {record.pid} {escape_text(record.comm)}: "
               f"{escape_text(record.reason)}") if isinstance(record, ActionOutcome) else escape_text(record.message)
    doc = {"@timestamp": iso_time(record.time), "ecs": {"version": ECS_VERSION}, "message": message,
           "event": {"kind": "event", "category": ["process"] if kind == "action" else ["host"],
                     "type": ["info"], "action": record.action, "module": "gpuguard", "dataset": DATASET,
                     "created": iso_time(when)},
           "host": host, "gpuguard": {"kind": kind, **body}}
    if isinstance(record, ActionOutcome):
        doc["event"]["outcome"] = "success" if record.status in ("done", "dry-run") else "failure"
        if record.pid:
            doc["process"] = {"pid": record.pid, "name": record.comm, "executable": record.exe}
    if fmt == "ocsf":   # OCSF has no class for these; keep ECS names under a marker
        doc["gpuguard"]["schema"] = "ecs"
    return dumps_line(doc)


class LogWriter(threading.Thread):
    """Writes queued records to a file (append) or stdout; never raises into the agent."""

    def __init__(self, path: str, fmt: str, counters: AgentCounters, capacity: int = 10000,
                 stderr: Callable[[str], None] | None = None) -> None:
        super().__init__(name="gpuguard-log", daemon=True)
        check_format(fmt)
        self.path, self.fmt, self.counters = path, fmt, counters
        self.queue = BoundedQueue(capacity, on_drop=self._dropped)
        counters.output_capacity = capacity
        self.host = host_fields()
        self._stderr = stderr or _stderr_line
        self._closing = threading.Event()
        self._reported: set[int] = set()
        self._fd: int | None = None
        self._open()

    def _dropped(self, _producer: str, count: int) -> None:
        self.counters.output_dropped += count

    def _open(self) -> None:
        if self.path == "-":
            self._fd = sys.stdout.fileno()
            return
        try:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise GpuguardError(f"cannot open the agent log {self.path}: {exc.strerror}",
                                "check the path and that its directory exists") from None

    def submit(self, record: Any) -> None:
        """Queue a record (any thread); a full queue drops and counts it."""
        self.queue.put((record, time.time()), "output")

    def run(self) -> None:
        while True:
            batch = self.queue.take_all(0.5)
            self.counters.output_depth = len(self.queue)
            if batch:
                self._write(batch)
            elif self._closing.is_set():
                return

    def close(self, timeout: float = 5.0) -> None:
        """Write what is queued, then stop."""
        self._closing.set()
        self.queue.wake()
        self.join(timeout)
        if self._fd is not None and self.path != "-":
            os.close(self._fd)
        self._fd = None

    def _write(self, batch: list) -> None:
        lines = []
        for record, when in batch:
            try:
                lines.append(render_record(record, self.fmt, self.host, when) + "\n")
            except Exception as exc:  # noqa: BLE001 - one record that cannot render must not stop the log
                self.counters.output_errors += 1
                self._report(0, f"cannot render a {type(record).__name__}: {type(exc).__name__}: {exc}")
        data = "".join(lines).encode("utf-8", "backslashreplace")
        try:
            while data:
                written = os.write(self._fd, data)
                data = data[written:]
        except OSError as exc:
            self.counters.output_errors += 1
            self.counters.last_output_error = exc.strerror or str(exc)
            what = "stdout" if self.path == "-" else self.path
            hint = {errno.EPIPE: "the reader of stdout went away", errno.ENOSPC: "the disk is full"}.get(
                exc.errno, exc.strerror)
            self._report(exc.errno or 0, f"cannot write the log to {what} ({hint}); "
                                         f"{len(lines)} lines lost, detection goes on")
            return
        self.counters.output_lines += len(lines)
        if self._reported:
            self._reported.clear()
            self._stderr("gpuguard: the log is being written again")

    def _report(self, key: int, line: str) -> None:
        if key not in self._reported:
            self._reported.add(key)
            self._stderr(f"gpuguard: {line}")


def _stderr_line(line: str) -> None:
    try:
        os.write(2, (escape_text(line) + "\n").encode("utf-8", "backslashreplace"))
    except OSError:
        pass   # stderr is gone too: the counters still say it
