"""Where log lines go: a size-rotated file, stdout, or syslog (RFC 5424 / RFC 3164).

Each sink takes one finished line (no newline) and its syslog severity, and
raises ``OSError`` when the destination fails (full disk, closed pipe, a
syslog socket that went away); :mod:`gpuguard.outputs.log_writer` turns that
into a counted, reported fault.  Sinks reopen on the next write after a
failure, so a destination that comes back is used again.

Details: docs/internals.md, "log_sinks".
"""

from __future__ import annotations

import errno
import os
import select
import socket
import time
from typing import Protocol

from gpuguard.outputs.ecs import iso_time

DEFAULT_MAX_BYTES = 50 * 1024 * 1024
DEFAULT_KEEP = 5
# A syslog daemon that stops reading fails a send after this long (counted), never hangs the writer.
SEND_TIMEOUT_S = 5.0
FILE_MODE = 0o640
FACILITIES = {
    "kern": 0,
    "user": 1,
    "daemon": 3,
    "auth": 4,
    "syslog": 5,
    "authpriv": 10,
    **{f"local{i}": 16 + i for i in range(8)},
}
SEVERITIES = {
    "emerg": 0,
    "alert": 1,
    "crit": 2,
    "err": 3,
    "warning": 4,
    "notice": 5,
    "info": 6,
    "debug": 7,
}
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


class Sink(Protocol):
    name: str

    def send(self, line: str, severity: int) -> None: ...
    def close(self) -> None: ...


def encode_line(line: str) -> bytes:
    # Lines are valid UTF-8 already (jsonl / escape_text); surrogates would be a bug upstream, never a crash here.
    return line.encode("utf-8", "backslashreplace")


class FileSink:
    """Appends lines to ``path``; rotates when the next line would pass ``max_bytes``, keeping ``keep`` old files."""

    def __init__(
        self, path: str, max_bytes: int = DEFAULT_MAX_BYTES, keep: int = DEFAULT_KEEP
    ) -> None:
        if max_bytes < 1 or keep < 0:
            raise ValueError("max_bytes must be >= 1 and keep >= 0")
        self.name = path
        self.path = path
        self.max_bytes = max_bytes
        self.keep = keep
        self._fd: int | None = None
        self._size = 0
        self._inode: tuple[int, int] | None = None
        self._fresh_line = (
            False  # a fragment could not be cut off: start the next record on a new line
        )

    def _open(self) -> int:
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
        st = os.fstat(fd)
        self._fd, self._size, self._inode = fd, st.st_size, (st.st_dev, st.st_ino)
        # A file that does not end on a record boundary (a crash mid-write, another writer):
        # the next record starts on a line of its own.
        self._fresh_line = bool(st.st_size) and os.pread(fd, 1, st.st_size - 1) != b"\n"
        return fd

    def _renamed_away(self) -> bool:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return True
        return (st.st_dev, st.st_ino) != self._inode

    def _rotate(self) -> None:
        self._drop_fd()
        if self.keep == 0:
            os.truncate(self.path, 0)
            return
        for index in range(self.keep - 1, 0, -1):
            older = f"{self.path}.{index}"
            if os.path.exists(older):
                os.replace(older, f"{self.path}.{index + 1}")
        if os.path.exists(self.path):
            os.replace(self.path, f"{self.path}.1")

    def send(self, line: str, severity: int) -> None:
        data = encode_line(line) + b"\n"
        if self._fd is not None and self._renamed_away():
            self._drop_fd()
        if self._fd is None:
            self._open()
        if self._size and self._size + len(data) > self.max_bytes:
            self._rotate()
            self._open()
        if self._fresh_line:
            data = b"\n" + data
        fd = self._fd
        assert fd is not None
        written = 0
        try:
            while written < len(data):
                written += os.write(fd, data[written:])
        except OSError:
            # The file must end on a record boundary: cut the fragment off, so the next record
            # (once there is space again) is not glued to it.  Truncating frees space, so it
            # works on a full disk; where it cannot, the next record starts on a fresh line.
            if written:
                try:
                    os.ftruncate(fd, self._size)
                except OSError:
                    self._size += written
                    self._fresh_line = True
            self._drop_fd()
            raise
        self._size += written
        self._fresh_line = False

    def _drop_fd(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
        self._fd = None

    def close(self) -> None:
        self._drop_fd()


class StdoutSink:
    """Lines on file descriptor 1."""

    name = "stdout"

    def __init__(self, fd: int = 1) -> None:
        self.fd = fd

    def send(self, line: str, severity: int) -> None:
        data = encode_line(line) + b"\n"
        written = 0
        while written < len(data):
            written += os.write(self.fd, data[written:])

    def close(self) -> None:
        pass


def rfc5424(
    line: str,
    severity: int,
    facility: int,
    hostname: str,
    app: str = "gpuguard",
    msgid: str = "-",
    now: float | None = None,
) -> str:
    """``<PRI>1 TIMESTAMP HOST APP PROCID MSGID - MSG``."""
    stamp = iso_time(time.time() if now is None else now)
    return f"<{facility * 8 + severity}>1 {stamp} {hostname or '-'} {app} {os.getpid()} {msgid} - {line}"


def rfc3164(
    line: str,
    severity: int,
    facility: int,
    hostname: str,
    app: str = "gpuguard",
    now: float | None = None,
) -> str:
    """``<PRI>Mmm dd hh:mm:ss HOST TAG[PID]: MSG`` (local time, as the RFC says)."""
    t = time.localtime(time.time() if now is None else now)
    stamp = f"{_MONTHS[t.tm_mon - 1]} {t.tm_mday:2d} {t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}"
    return (
        f"<{facility * 8 + severity}>{stamp} {hostname or 'localhost'} {app}[{os.getpid()}]: {line}"
    )


class SyslogSink:
    """Syslog over a unix socket, UDP or TCP.

    ``target``: ``unix:/dev/log`` | ``udp:HOST:PORT`` | ``tcp:HOST:PORT``
    (IPv6 hosts in brackets: ``udp:[::1]:514``).
    """

    def __init__(
        self,
        target: str = "unix:/dev/log",
        framing: str = "rfc5424",
        facility: str = "daemon",
        hostname: str | None = None,
        app: str = "gpuguard",
    ) -> None:
        if framing not in ("rfc5424", "rfc3164"):
            raise ValueError(f"unknown syslog format {framing!r} (rfc5424 or rfc3164)")
        if facility not in FACILITIES:
            raise ValueError(
                f"unknown syslog facility {facility!r} (one of {', '.join(FACILITIES)})"
            )
        self.name = f"syslog:{target}"
        self.transport, self.address = parse_syslog_target(target)
        self.framing = framing
        self.facility = FACILITIES[facility]
        self.hostname = hostname or socket.gethostname()
        self.app = app
        self._sock: socket.socket | None = None
        self._stream = False
        self.late_losses = 0  # datagrams counted as sent that a later refusal showed were lost

    def _connect(self) -> socket.socket:
        if self.transport == "unix":
            for kind in (socket.SOCK_DGRAM, socket.SOCK_STREAM):
                sock = socket.socket(socket.AF_UNIX, kind | socket.SOCK_CLOEXEC)
                sock.settimeout(SEND_TIMEOUT_S)
                try:
                    sock.connect(self.address)
                except OSError as exc:
                    sock.close()
                    if exc.errno != errno.EPROTOTYPE:
                        raise
                    continue
                self._sock, self._stream = sock, kind == socket.SOCK_STREAM
                return sock
            raise OSError(errno.EPROTOTYPE, f"cannot connect to {self.address}")
        host, port = self.address
        kind = socket.SOCK_DGRAM if self.transport == "udp" else socket.SOCK_STREAM
        family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=kind)[0]
        sock = socket.socket(family, kind | socket.SOCK_CLOEXEC)
        sock.settimeout(SEND_TIMEOUT_S)
        try:
            sock.connect(sockaddr)
        except OSError:
            sock.close()
            raise
        self._sock, self._stream = sock, kind == socket.SOCK_STREAM
        return sock

    def frame(self, line: str, severity: int) -> str:
        if self.framing == "rfc3164":
            return rfc3164(line, severity, self.facility, self.hostname, self.app)
        return rfc5424(line, severity, self.facility, self.hostname, self.app)

    def send(self, line: str, severity: int) -> None:
        self.send_framed(encode_line(self.frame(line, severity)))

    def send_framed(self, data: bytes) -> None:
        """Send one framed message; raises OSError when it did not reach the collector's socket."""
        sock = self._sock
        if sock is not None and self._stream and _peer_closed(sock):
            self.close()  # the collector went away (FIN seen): reconnect rather than lose a line
            sock = None
        sock = sock or self._connect()
        try:
            if self._stream:
                sock.sendall(data + b"\n")
            else:
                self._send_datagram(sock, data)
        except OSError:
            self.close()
            raise

    def _send_datagram(self, sock: socket.socket, data: bytes) -> None:
        """A datagram counts as sent only when no refusal (ICMP port unreachable) is pending for it.

        On a connected UDP socket the refusal of one datagram is reported on the next call:
        on loopback it is there as soon as send returns (read through SO_ERROR, which clears
        it); from a remote host it comes later and fails the next send, which then reports
        that earlier datagram as lost (``late_losses``) and is tried once more.
        """
        try:
            sock.send(data)
        except ConnectionRefusedError:
            self.late_losses += 1
            sock.send(data)
        error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if error:
            raise OSError(error, os.strerror(error))

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _peer_closed(sock: socket.socket) -> bool:
    """True when a stream socket's peer has closed (a collector never sends us data)."""
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    events = poller.poll(0)
    if not events:
        return False
    if events[0][1] & (select.POLLHUP | select.POLLERR):
        return True
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""  # readable: returns at once
    except OSError:
        return True


def parse_syslog_target(target: str) -> tuple[str, object]:
    """``unix:PATH`` -> ("unix", PATH); ``udp:HOST:PORT`` / ``tcp:HOST:PORT`` -> (proto, (HOST, PORT))."""
    transport, _, rest = target.partition(":")
    if transport == "unix" and rest.startswith("/"):
        return "unix", rest
    if transport in ("udp", "tcp"):
        host, _, port = rest.rpartition(":")
        host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        if host and port.isdigit() and 0 < int(port) < 65536:
            return transport, (host, int(port))
    raise ValueError(
        f"bad syslog target {target!r} (unix:/dev/log, udp:HOST:PORT or tcp:HOST:PORT)"
    )
