"""A bounded on-disk spool in front of a TCP syslog collector that is away: kept in order, replayed.

:class:`SpoolingSink` wraps a :class:`~gpuguard.outputs.log_sinks.SyslogSink`.
While the collector takes lines, they go straight through.  When a send fails
(refused, reset, the collector closed its end), that line and every later one
are framed as they would have been sent (their own timestamps) and appended to
the spool file; at most once per ``retry_s`` a reconnect is tried, and when it
works the spool is sent in order before anything new.  Past ``max_bytes`` a
line is not spooled but lost, and counted (``overflowed``).

Details: docs/internals.md, "log_spool".
"""

from __future__ import annotations

import os
import time

from gpuguard.outputs.log_sinks import FILE_MODE, SyslogSink, encode_line

DEFAULT_SPOOL_BYTES = 64 * 1024 * 1024
DEFAULT_SPOOL_DIR = "/var/lib/gpuguard/spool"
RETRY_S = 1.0


class Spooled(OSError):
    """The line was kept in the spool, not sent (the collector is away)."""


class SpoolFull(OSError):
    """The collector is away and the spool is full: the line is lost."""


class SpoolingSink:
    """``inner`` with a spool at ``path`` of at most ``max_bytes`` (see the module docstring)."""

    def __init__(
        self, inner: SyslogSink, path: str, max_bytes: int = DEFAULT_SPOOL_BYTES, retry_s=RETRY_S
    ) -> None:
        self.inner = inner
        self.name = inner.name
        self.path = path
        self.max_bytes = max_bytes
        self.retry_s = retry_s
        self.spooled = 0
        self.replayed = 0
        self.overflowed = 0
        self.inherited = 0
        self._bytes = 0
        self._next_try = 0.0
        try:
            with open(path, "rb") as f:
                left = f.read()
        except FileNotFoundError:
            left = b""
        if left:
            self.inherited = self.spooled = left.count(b"\n")
            self._bytes = len(left)

    @property
    def late_losses(self) -> int:
        return self.inner.late_losses

    def send(self, line: str, severity: int) -> None:
        data = encode_line(self.inner.frame(line, severity))
        if self.spooled and not self.poll():
            self._keep(data)
        try:
            self.inner.send_framed(data)
        except OSError as exc:
            self._next_try = time.monotonic() + self.retry_s
            self._keep(data, exc)

    def poll(self) -> bool:
        """Try to send the spool (at most once per ``retry_s``); True when it is empty."""
        if not self.spooled:
            return True
        if time.monotonic() < self._next_try:
            return False
        self._next_try = time.monotonic() + self.retry_s
        with open(self.path, "rb") as f:
            lines = f.read().split(b"\n")[:-1]
        sent = 0
        try:
            for data in lines:
                self.inner.send_framed(data)
                sent += 1
        except OSError:
            pass
        finally:
            self.replayed += sent
            self.spooled -= sent
            self._rewrite(lines[sent:])
        return not self.spooled

    def _keep(self, data: bytes, cause: OSError | None = None) -> None:
        """Append one framed line to the spool; raises Spooled, or SpoolFull when it is lost."""
        reason = f" ({cause.strerror or cause})" if cause is not None else ""
        if self._bytes + len(data) + 1 > self.max_bytes:
            self.overflowed += 1
            raise SpoolFull(0, f"the collector is away{reason} and the spool {self.path} is full")
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
        try:
            size = os.fstat(fd).st_size
            try:
                body, written = data + b"\n", 0
                while written < len(body):
                    written += os.write(fd, body[written:])
            except OSError:
                os.ftruncate(fd, size)  # never a fragment in the spool
                self.overflowed += 1
                raise
        finally:
            os.close(fd)
        self._bytes += len(data) + 1
        self.spooled += 1
        raise Spooled(0, f"the collector is away{reason}: kept in the spool {self.path}")

    def _rewrite(self, lines: list[bytes]) -> None:
        if not lines:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            self._bytes = 0
            return
        tmp = f"{self.path}.tmp"
        body = b"".join(data + b"\n" for data in lines)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
        try:
            os.write(fd, body)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        self._bytes = len(body)

    def close(self) -> None:
        self.inner.close()
