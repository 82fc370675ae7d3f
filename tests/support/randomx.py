"""The RandomX stand-in (tests/workloads/randomx_standin.c) and a loopback pool for it.

:class:`LoopbackPool` listens on 127.0.0.1 (plain TCP or TLS), pushes a ~200-byte "job" to
every client at random intervals (10-120 s by default, as pools push new jobs) and answers
each line a client sends with a ~40-byte result.  :func:`start_standin` builds the stand-in
(stripped: no file names or symbols), installs it under an ordinary name and path and starts
it with its settings on stdin, so its command line is its path alone.  Stand-ins and CPU hogs run
in the load group (:mod:`tests.support.load`).
"""

from __future__ import annotations

import hashlib
import os
import pwd
import random
import select
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from gpuguard.sources.proc.huge_pages import status_hugetlb_kib
from tests.support.hugepages import reservation_open
from tests.support.load import join_load_group, start_in_load_group

SOURCE = Path(__file__).resolve().parent.parent / "workloads" / "randomx_standin.c"
# An ordinary path, not a temporary directory; one per test process, so a run beside this one
# (another worker, another checkout) never removes the stand-ins this one installed.
INSTALL_DIR = Path(f"/opt/gg-test-randomx-{os.getpid()}")


def build_standin() -> Path:
    """Compile the stand-in once per source version (stripped); return the binary."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    directory = Path(tempfile.gettempdir()) / "gpuguard-test-bin"
    directory.mkdir(parents=True, exist_ok=True)
    binary = directory / f"standin-{digest}"
    if not binary.exists():
        tmp = binary.with_name(f"{binary.name}.{os.getpid()}.tmp")
        subprocess.run(
            ["gcc", "-O2", "-Wall", "-s", "-pthread", "-o", str(tmp), str(SOURCE)]
            + ["-lssl", "-lcrypto", "-lm"],
            check=True,
        )
        tmp.rename(binary)
    return binary


class LoopbackServer:
    """A TCP listener on 127.0.0.1 serving each client on a thread of its own (``_session``);
    :meth:`start` once the subclass is ready."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self._stop = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._session, args=(conn,), daemon=True).start()

    def _session(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self._stop.set()
        self.sock.close()


class LoopbackPool(LoopbackServer):
    """A pool on 127.0.0.1 that pushes jobs and answers submits (TLS with ``tls``)."""

    def __init__(
        self, workdir: Path, tls: bool = True, push_s: tuple[float, float] = (10.0, 120.0)
    ) -> None:
        self.context: ssl.SSLContext | None = None
        if tls:
            cert, key = workdir / "pool.crt", workdir / "pool.key"
            subprocess.run(
                ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key)]
                + ["-out", str(cert), "-subj", "/CN=peer.test", "-days", "1"],
                check=True,
                capture_output=True,
            )
            self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.context.load_cert_chain(cert, key)
        super().__init__()
        self.push_s = push_s
        self.lines_in = 0
        self.pushes = 0
        self._rng = random.Random(22)
        self.start()

    def _session(self, conn: socket.socket) -> None:
        try:
            if self.context is not None:
                conn = self.context.wrap_socket(conn, server_side=True)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            next_push = time.monotonic() + self._rng.uniform(*self.push_s)
            while not self._stop.is_set():
                pending = isinstance(conn, ssl.SSLSocket) and conn.pending()
                if pending or select.select([conn], [], [], 0.5)[0]:
                    data = conn.recv(4096)
                    if not data:
                        return
                    for _ in range(data.count(b"\n")):
                        self.lines_in += 1
                        conn.sendall(b'{"id":%d,"s":"ok","e":null}\n' % self.lines_in)
                if time.monotonic() >= next_push:
                    self.pushes += 1
                    blob = os.urandom(76).hex().encode()
                    conn.sendall(b'{"j":"%d","b":"%s","t":"f3220000"}\n' % (self.pushes, blob))
                    next_push = time.monotonic() + self._rng.uniform(*self.push_s)
        except (OSError, ssl.SSLError):
            return
        finally:
            conn.close()


def start_standin(
    pool: LoopbackPool,
    name: str = "nodestatd",
    *,
    tls: bool | None = None,
    threads: int = 0,
    nice: int = 0,
    memory_mib: int = 256,
    dataset: bool = False,
    rounding: bool = True,
    submit_s: float = 20.0,
    huge_pages: bool | None = None,
    low_weight: bool = True,
    user: str | None = None,
) -> subprocess.Popen:
    """Install the stand-in as INSTALL_DIR/name, start it on ``pool`` and wait for "ready".
    ``huge_pages``: whether it may get any (by default: whether this test reserved some);
    ``low_weight``: in the load group's low CPU weight once ready (tests/support/load.py);
    ``user``: run as that user (e.g. nobody) rather than root."""
    tls = pool.context is not None if tls is None else tls
    INSTALL_DIR.mkdir(parents=True, exist_ok=True)
    exe = INSTALL_DIR / name
    tmp = exe.with_name(f".{name}.{os.getpid()}")
    shutil.copy2(build_standin(), tmp)
    tmp.rename(exe)
    settings = (
        f"peer_ip 127.0.0.1\npeer_port {pool.port}\ntls {int(tls)}\nthreads {threads}\n"
        f"nice {nice}\nmemory {memory_mib}\nrounding {int(rounding)}\nsubmit_s {submit_s}\n"
        f"dataset {int(dataset)}\n"
    )
    # settings on stdin: the command line is the program's path alone
    proc = subprocess.Popen(
        [str(exe)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        user=user,
        group=pwd.getpwnam(user).pw_gid if user else None,
        extra_groups=[] if user else None,
    )
    # the huge-page group before its settings (it maps nothing till then); its set-up (filling
    # its buffer, a 2 GiB dataset in fast mode, the pool's handshake) at an ordinary weight:
    # at the load group's, a busy run stretched a fast-mode start to most of a minute
    join_load_group(proc.pid, huge_pages=huge_pages, low_weight=False)
    proc.stdin.write(settings.encode())
    proc.stdin.close()
    line = proc.stdout.readline()
    if line.strip() != b"ready":
        proc.kill()
        proc.wait()
        raise RuntimeError(f"stand-in did not start: {proc.stderr.read().decode()[-400:]}")
    expects_pages = reservation_open() if huge_pages is None else huge_pages
    if expects_pages and not status_hugetlb_kib(Path(f"/proc/{proc.pid}/status").read_bytes()):
        proc.kill()
        proc.wait()  # its verdicts would be about a stand-in without its huge pages
        raise RuntimeError(
            f"stand-in {name} got no huge pages though this test reserved them: another process "
            f"on the host took the free ones ({_pool_line()}; fix: whatever maps huge pages in "
            "the tests joins the load group or reserves its own, tests/support/hugepages.py)"
        )
    if low_weight:  # its busy loop
        join_load_group(proc.pid, huge_pages=huge_pages)
    return proc


def _pool_line() -> str:
    meminfo = Path("/proc/meminfo").read_text().splitlines()
    return ", ".join(line.replace(" ", "") for line in meminfo if line.startswith("HugePages_"))


def stop(proc: subprocess.Popen | None) -> None:
    """Kill a started process (by its Popen: no pid reuse) and reap it.  A killed process still
    has to run to exit: a stand-in's nice-19 workers in the load group's low weight, beside
    busy loops of ordinary weight, were seen to need more than 10 s of wall time for it."""
    if proc is not None and proc.poll() is None:
        proc.kill()
    if proc is not None:
        proc.wait(timeout=60)


def cpu_hog(seconds: float = 600.0) -> subprocess.Popen:
    """One process spinning a core (the busy host beside the stand-in), in the load group."""
    return start_in_load_group(
        [
            sys.executable,
            "-c",
            f"import time\nend=time.time()+{seconds}\nwhile time.time()<end: pass",
        ]
    )
