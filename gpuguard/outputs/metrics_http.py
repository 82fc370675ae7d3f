"""The metrics port: /metrics, /healthz and /readyz over HTTP or TLS, everything else 404.

:func:`serve` runs one threaded HTTP server for an :class:`~gpuguard.outputs.metrics.AgentMetrics`
registry.  Only the three paths answer, and only GET and HEAD; any other path is 404 and says
nothing else.  A :class:`~gpuguard.outputs.web_config.WebConfig` adds TLS (its certificate and
key are read again when they change on disk, so a rotated certificate needs no restart) and
basic auth and a required client certificate on ``/metrics``; the health paths stay open to
the kubelet's probes, which send neither.  Details: docs/deploy.md, "Metrics".
"""

from __future__ import annotations

import base64
import hashlib
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client.exposition import ThreadingWSGIServer

from gpuguard.outputs.web_config import TlsFiles, WebConfig

# The one definition of the default port: the packaging, docs and tests read it from here
# (tests/test_deploy.py checks).  The Prometheus wiki's default-port list has every port of
# 9100-9999 taken, so it lies outside that range, below Kubernetes' NodePort range and Linux's
# ephemeral ports, clear of what GPU nodes run (docs/deploy.md, "Metrics port").
DEFAULT_METRICS_PORT = 19479
PATHS = ("/metrics", "/healthz", "/readyz")
# A connection that sends nothing (or never finishes its TLS handshake) is dropped after this.
REQUEST_TIMEOUT_S = 10.0
# Verified (user, password) results kept, so a scrape every 15 s costs one bcrypt, not one each.
AUTH_CACHE_SIZE = 256
# Compared when the user is unknown, so an unknown user costs what a known one does (a bcrypt
# hash of a random string nobody knows).
_NO_USER_HASH = b"$2b$10$OXRmKSAp08K6kzNfAqNJQeGRtCr2bImZrd3EOS4BLmoWtaNmAnq3m"
_TEXT = [("Content-Type", "text/plain; charset=utf-8"), ("Cache-Control", "no-store")]
CLIENT_CERT_KEY = "gpuguard.client_cert_verified"  # WSGI environ: a verified client certificate


def serve(
    address: str,
    metrics_app: Callable,
    health: AgentHealth | None = None,
    web: WebConfig | None = None,
    on_problem: Callable[[str], None] | None = None,
) -> MetricsServer:
    """Serve ``metrics_app`` at ``/metrics`` (and the health paths) on ``HOST:PORT``
    (``[::1]:PORT`` for IPv6; port 0 picks a free one).  ``on_problem`` hears, once per change
    on disk, that a new certificate could not be loaded (the previous one stays in use)."""
    host, port = parse_address(address)
    health = health or AgentHealth()
    web = web or WebConfig()
    auth = BasicAuth(web.users) if web.users else None
    tls = TlsReloader(web.tls, on_problem) if web.tls is not None else None
    needs_cert = web.tls is not None and web.tls.requires_client_cert

    def app(environ: dict, start_response: Callable) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path not in PATHS:
            return _answer(start_response, "404 Not Found", "not found\n")
        if environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
            return _answer(
                start_response, "405 Method Not Allowed", "GET or HEAD\n", ("Allow", "GET, HEAD")
            )
        if path == "/metrics":
            if needs_cert and not environ.get(CLIENT_CERT_KEY):
                return _answer(start_response, "403 Forbidden", "client certificate required\n")
            if auth is not None and not auth.allows(environ.get("HTTP_AUTHORIZATION", "")):
                challenge = ("WWW-Authenticate", 'Basic realm="gpuguard", charset="UTF-8"')
                return _answer(start_response, "401 Unauthorized", "unauthorized\n", challenge)
            return metrics_app(environ, start_response)
        ok, reason = health.live() if path == "/healthz" else health.ready()
        return _answer(start_response, "200 OK" if ok else "503 Service Unavailable", reason + "\n")

    class Server(ThreadingWSGIServer):
        address_family = _family(host, port)

        def get_request(self) -> tuple[Any, Any]:
            conn, peer = super().get_request()
            if tls is not None:  # the handshake runs in the request's own thread
                conn = tls.context().wrap_socket(
                    conn, server_side=True, do_handshake_on_connect=False
                )
            return conn, peer

        def finish_request(self, request: Any, client_address: Any) -> None:
            request.settimeout(REQUEST_TIMEOUT_S)
            if isinstance(request, ssl.SSLSocket):
                try:
                    request.do_handshake()
                except (ssl.SSLError, OSError):
                    return  # a scanner, a wrong CA, or close()'s wake-up: nothing to answer
            super().finish_request(request, client_address)

        def handle_error(self, request: Any, client_address: Any) -> None:
            pass  # a client that went away mid-answer: no traceback on the agent's stderr

    httpd = make_server(host, port, _with_head(app), Server, handler_class=_QuietHandler)
    thread = threading.Thread(
        target=httpd.serve_forever,
        kwargs={"poll_interval": SERVE_POLL_S},
        name="gpuguard-metrics",
        daemon=True,
    )
    thread.start()
    return MetricsServer(httpd, thread)


def _with_head(app: Callable) -> Callable:
    """HEAD answers as GET does, without the body (RFC 9110, 9.3.2): the same status and headers,
    the GET body's Content-Length.  prometheus_client's app answers HEAD with 405 itself."""

    def head_or_get(environ: dict, start_response: Callable) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD") != "HEAD":
            return app(environ, start_response)
        answered: list = []

        def capture(status: str, headers: list, exc_info: Any = None) -> Callable:
            answered[:] = [status, headers]
            return lambda data: None

        chunks = app({**environ, "REQUEST_METHOD": "GET"}, capture)
        try:
            size = sum(len(chunk) for chunk in chunks)
        finally:
            getattr(chunks, "close", lambda: None)()
        status, headers = answered
        kept = [(k, v) for k, v in headers if k.lower() != "content-length"]
        start_response(status, [*kept, ("Content-Length", str(size))])
        return []

    return head_or_get


def _answer(start_response: Callable, status: str, body: str, *headers: tuple[str, str]) -> list:
    start_response(status, [*_TEXT, *headers])
    return [body.encode("utf-8", "backslashreplace")]


class BasicAuth:
    """``Authorization: Basic`` against bcrypt hashes, as the exporter-toolkit checks it: one
    bcrypt at a time (a flood of guesses takes one core, not all), results cached by a digest of
    user, hash and password, and an unknown user costing what a known one does."""

    def __init__(self, users: dict[str, str]) -> None:
        self.users = {u: h.encode() for u, h in users.items()}
        self._lock = threading.Lock()
        self._cache: dict[bytes, bool] = {}

    def allows(self, header: str) -> bool:
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, sep, password = (
                base64.b64decode(encoded.strip(), validate=True).decode().partition(":")
            )
        except (ValueError, UnicodeDecodeError):
            return False
        if not sep:
            return False
        digest = self.users.get(user, _NO_USER_HASH)
        key = hashlib.sha256(b"\0".join((user.encode(), digest, password.encode()))).digest()
        with self._lock:
            known = self._cache.get(key)
            if known is None:
                known = _bcrypt_matches(password.encode(), digest) and user in self.users
                if len(self._cache) >= AUTH_CACHE_SIZE:
                    self._cache.clear()
                self._cache[key] = known
        return known


def _bcrypt_matches(password: bytes, digest: bytes) -> bool:
    import bcrypt  # loaded only when basic auth is configured

    if len(password) > 72:  # bcrypt reads 72 bytes at most: a longer one cannot be the password
        return False
    try:
        return bcrypt.checkpw(password, digest)
    except ValueError:
        return False


class TlsReloader:
    """The TLS context, built again when the certificate, key or client CA changes on disk; a
    change that does not load keeps the previous context and is reported once."""

    def __init__(self, files: TlsFiles, on_problem: Callable[[str], None] | None) -> None:
        self.files = files
        self.on_problem = on_problem
        self._lock = threading.Lock()
        self._stamp = self._stamp_now()
        self._context = files.context()
        self._failed: tuple | None = None

    def _stamp_now(self) -> tuple:
        stamps = []
        for path in self.files.paths:
            try:
                st = os.stat(path)
            except OSError:
                stamps.append(None)
                continue
            stamps.append((st.st_ino, st.st_size, st.st_mtime_ns))
        return tuple(stamps)

    def context(self) -> ssl.SSLContext:
        stamp = self._stamp_now()
        with self._lock:
            if stamp != self._stamp and stamp != self._failed:
                try:
                    self._context = self.files.context()
                    self._stamp, self._failed = stamp, None
                except (ssl.SSLError, OSError) as exc:
                    self._failed = stamp
                    if self.on_problem is not None:
                        self.on_problem(
                            f"metrics TLS: cannot load the changed certificate files ({exc}); "
                            "serving with the previous ones"
                        )
            return self._context


class _QuietHandler(WSGIRequestHandler):
    """No access log on stderr (a scrape every few seconds would fill the journal); tells the
    app whether the client gave a certificate the handshake verified."""

    timeout = REQUEST_TIMEOUT_S

    def get_environ(self) -> dict:
        environ = super().get_environ()
        conn = self.connection
        environ[CLIENT_CERT_KEY] = isinstance(conn, ssl.SSLSocket) and bool(conn.getpeercert())
        return environ

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _family(host: str, port: int) -> socket.AddressFamily:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    return infos[0][0]


DEFAULT_STALL_S = 30.0


class AgentHealth:
    """What ``/healthz`` and ``/readyz`` answer.

    Liveness: the detect loop calls :meth:`loop_turned` on every cycle (at least four a
    second); no turn for ``stall_after_s`` is a stall.  With probes attached, the sensor
    thread's last completed poll (``sensor_polled() -> monotonic seconds``) must be as
    recent, and the thread alive (``sensor_alive()``).  Before the first turn (start-up
    compiles the probes, tens of seconds) the answer is 200 "starting".
    Readiness: ``ready_reason()`` returns None once probes are attached or reduced mode is
    declared, the GPU samplers tried to open and the first sweep is done, else why not.
    """

    def __init__(self, stall_after_s: float = DEFAULT_STALL_S, clock: Callable = time.monotonic):
        self.stall_after_s = stall_after_s
        self.clock = clock
        self.loop_at: float | None = None
        self.sensor_polled: Callable[[], float | None] | None = None
        self.sensor_alive: Callable[[], bool] | None = None
        self.ready_reason: Callable[[], str | None] | None = None
        self.stopping = False

    def loop_turned(self) -> None:
        self.loop_at = self.clock()

    def live(self) -> tuple[bool, str]:
        now = self.clock()
        if self.loop_at is None:
            return True, "starting"
        if self.stopping:
            return True, "stopping"
        stalled = now - self.loop_at
        if stalled > self.stall_after_s:
            return False, f"detect loop stalled: no cycle for {stalled:.0f} s"
        if self.sensor_alive is not None and not self.sensor_alive():
            return False, "sensor thread ended while probes are attached"
        polled = self.sensor_polled() if self.sensor_polled is not None else None
        if polled is not None and now - polled > self.stall_after_s:
            return False, f"sensor stopped delivering: no poll for {now - polled:.0f} s"
        return True, "ok"

    def ready(self) -> tuple[bool, str]:
        if self.ready_reason is None:
            return False, "starting"
        reason = self.ready_reason()
        return (True, "ready") if reason is None else (False, reason)


# The server thread waits this long for a connection before it looks at a shutdown request
# (socketserver's default, 0.5 s, woke an idle agent twice a second); close() wakes it sooner.
SERVE_POLL_S = 60.0


class MetricsServer:
    """A running ``/metrics`` endpoint; :meth:`close` stops it."""

    def __init__(self, server: Any, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread
        self.host, self.port = server.server_address[:2]

    def close(self) -> None:
        """Stop serving: ask the loop to end, then wake its wait with a connection of our own
        (an empty request, answered with nothing) so it ends now, not at its next poll."""
        stopper = threading.Thread(target=self._server.shutdown, daemon=True)
        stopper.start()
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(self.host, self.host)
        while stopper.is_alive():
            try:
                socket.create_connection((host, self.port), timeout=1.0).close()
            except OSError:
                break  # cannot reach it: the loop ends at its poll, within SERVE_POLL_S
            stopper.join(0.05)
        stopper.join(5.0)
        self._server.server_close()
        self._thread.join(5.0)


def parse_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` -> (host, port); ``:PORT`` means every interface."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(
            f"bad metrics address {address!r} (expected HOST:PORT, e.g. 127.0.0.1:{DEFAULT_METRICS_PORT})"
        )
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    return host or "0.0.0.0", int(port)
