"""The benign corpus: Debian's servers and busy workers holding quiet sessions to them, as nobody.

:class:`Servers` starts memcached (a cache, default port 11211) and beanstalkd (a job queue,
11300), both inside the pool-port range 10001-18192 as their defaults are, redis-server (a
key-value store) and PostgreSQL (a database), each as ``nobody`` on loopback, and a producer
that hands their workers a job now and then (a beanstalkd put, a redis RPUSH and PUBLISH, a
PostgreSQL NOTIFY), as a queue's other side does.  :func:`start_worker` starts one worker
(tests/workloads/busy_worker.py or busy_worker.c) as ``nobody`` from /opt under an ordinary
name, in the load group (tests/support/load.py): one core of compression, hashing or numeric
work beside one long, quiet session.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from tests.support.load import join_load_group
from tests.support.processes import terminate
from tests.support.workloads import build_c_program

WORKLOADS = Path(__file__).resolve().parent.parent / "workloads"
PG_BIN = Path("/usr/lib/postgresql/15/bin")
NOBODY = 65534
# One directory per test process (an ordinary path, not a temporary one): runs beside this one
# never remove the workers this one installed.
INSTALL_DIR = Path(f"/opt/gg-test-workers-{os.getpid()}")
# Where each server listens by default: memcached and beanstalkd inside 10001-18192.
DEFAULT_PORTS = {"memcached": 11211, "beanstalkd": 11300, "redis": 6379, "postgres": 5432}


@dataclass(frozen=True)
class Worker:
    """One corpus member: its name, language, server and what it computes."""

    name: str
    language: str  # "python" | "c"
    server: str
    work: str


CORPUS = (
    Worker("thumbcache", "python", "memcached", "zlib and lzma compression"),
    Worker("reportgen", "python", "postgres", "SHA-256 and PBKDF2"),
    Worker("tilerender", "python", "redis", "Mandelbrot tiles in floats"),
    Worker("digestd", "c", "beanstalkd", "SHA-256 (OpenSSL)"),
    Worker("packerd", "c", "memcached", "zlib deflate"),
    Worker("heatsolve", "c", "redis", "Jacobi sweeps (libm)"),
)
IN_POOL_RANGE = {"memcached", "beanstalkd"}


def _free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_from(port: int) -> int:
    """``port`` or the next free one after it (a server's default, kept in its range)."""
    for candidate in range(port, port + 400):
        if _free(candidate):
            return candidate
    raise RuntimeError(f"no free port from {port}")


def _wait_listening(port: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server on {port} exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {port}")


def _as_nobody(argv: list[str], **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        argv, user=NOBODY, group=NOBODY, extra_groups=[], stdin=subprocess.DEVNULL, **kwargs
    )


def _resp(*words: bytes) -> bytes:
    return b"*%d\r\n" % len(words) + b"".join(b"$%d\r\n%s\r\n" % (len(w), w) for w in words)


class Servers:
    """The four servers and the producer; a context manager.  ``ports``: server -> port."""

    def __init__(self, push_s: tuple[float, float] = (10.0, 60.0)) -> None:
        self.home: Path | None = None  # the servers' files, nobody's (made by _start)
        self.push_s = push_s
        self.ports: dict[str, int] = {}
        self.procs: list[subprocess.Popen] = []
        self.pushes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Servers:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _start(self) -> None:
        home = self.home = Path(tempfile.mkdtemp(prefix="gg-servers-"))
        home.chmod(0o755)  # a test's own directory may be root's alone: nobody needs a way in
        os.chown(home, NOBODY, NOBODY)
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        port = self.ports["memcached"] = free_port_from(DEFAULT_PORTS["memcached"])
        self.procs.append(
            _as_nobody(["memcached", "-l", "127.0.0.1", "-p", str(port), "-U", "0", "-m", "32"])
        )
        port = self.ports["beanstalkd"] = free_port_from(DEFAULT_PORTS["beanstalkd"])
        self.procs.append(_as_nobody(["beanstalkd", "-l", "127.0.0.1", "-p", str(port)], **quiet))
        port = self.ports["redis"] = free_port_from(DEFAULT_PORTS["redis"])
        redis_argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
        redis_argv += ["--appendonly", "no", "--dir", str(home)]
        self.procs.append(_as_nobody(redis_argv, **quiet))
        data = home / "pg"
        subprocess.run(
            [str(PG_BIN / "initdb"), "-D", str(data), "-U", "nobody", "--auth=trust", "-E", "UTF8"]
            + ["--no-sync"],
            user=NOBODY,
            group=NOBODY,
            extra_groups=[],
            cwd=home,
            check=True,
            capture_output=True,
        )
        port = self.ports["postgres"] = free_port_from(DEFAULT_PORTS["postgres"])
        pg_argv = [str(PG_BIN / "postgres"), "-D", str(data), "-p", str(port), "-k", str(home)]
        pg_argv += ["-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"]
        # its default (huge_pages=try) maps its shared memory in huge pages whenever the pool
        # has free ones: the pages the host tests beside this one reserved for their stand-ins,
        # which then fell back to ordinary pages and were judged without them
        pg_argv += ["-c", "huge_pages=off"]
        self.procs.append(_as_nobody(pg_argv, cwd=home, **quiet))
        for name in ("memcached", "beanstalkd", "redis", "postgres"):
            _wait_listening(self.ports[name], self.procs[list(DEFAULT_PORTS).index(name)])
        self._thread = threading.Thread(target=self._produce, daemon=True)
        self._thread.start()

    def _produce(self) -> None:
        """A job for each queue at random moments in ``push_s``, over connections kept open."""
        import psycopg2

        rng = random.Random(37)
        bean = socket.create_connection(("127.0.0.1", self.ports["beanstalkd"]))
        bean.sendall(b"use jobs\r\n")
        bean.recv(64)
        red = socket.create_connection(("127.0.0.1", self.ports["redis"]))
        pg = None
        for _ in range(100):  # the server may still be starting
            try:
                pg = psycopg2.connect(
                    host="127.0.0.1", port=self.ports["postgres"], user="nobody", dbname="postgres"
                )
                break
            except psycopg2.OperationalError:
                time.sleep(0.2)
        pg.autocommit = True
        try:
            while not self._stop.wait(rng.uniform(*self.push_s)):
                job = b"job-%d" % self.pushes
                bean.sendall(b"put 0 0 60 %d\r\n%s\r\n" % (len(job), job))
                bean.recv(64)
                red.sendall(_resp(b"RPUSH", b"jobs", job) + _resp(b"PUBLISH", b"jobs", job))
                red.recv(256)
                pg.cursor().execute("NOTIFY jobs, %s", (job.decode(),))
                self.pushes += 1
        except OSError:
            return
        finally:
            bean.close()
            red.close()
            pg.close()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        for proc in reversed(self.procs):
            terminate(proc, 20)
        if self.home is not None:
            shutil.rmtree(self.home, ignore_errors=True)


def _installed(worker: Worker) -> list[str]:
    """The worker's command line, its program installed under INSTALL_DIR (readable by nobody)."""
    INSTALL_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
    if worker.language == "c":
        binary = build_c_program(
            WORKLOADS / "busy_worker.c",
            flags=("-pthread",),
            libs=("-lssl", "-lcrypto", "-lz", "-lmemcached", "-lhiredis", "-lm"),
        )
        exe = INSTALL_DIR / worker.name
        if not exe.exists():
            shutil.copy2(binary, exe)
        return [str(exe)]
    script = INSTALL_DIR / f"{worker.name}.py"
    if not script.exists():
        shutil.copy2(WORKLOADS / "busy_worker.py", script)
    return ["/usr/bin/python3", str(script)]


def start_worker(worker: Worker, servers: Servers, heartbeat_s: float = 60.0) -> subprocess.Popen:
    """Start ``worker`` as nobody against its server, in the load group; wait for "ready".
    ``heartbeat_s``: how often a cache client sets its heartbeat key."""
    argv = _installed(worker) + [worker.server, str(servers.ports[worker.server])]
    if worker.server == "memcached":
        argv.append(f"{heartbeat_s:g}")
    proc = _as_nobody(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/")
    join_load_group(proc.pid, huge_pages=False)
    line = proc.stdout.readline()
    if line.strip() != b"ready":
        terminate(proc, 10)
        raise RuntimeError(f"{worker.name} did not start: {proc.stderr.read().decode()[-400:]}")
    return proc


def remove_installed() -> None:
    shutil.rmtree(INSTALL_DIR, ignore_errors=True)
