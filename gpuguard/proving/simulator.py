"""A harmless miner simulator for ``gpuguard selftest``: looks like a GPU miner, mines nothing.

``python -m gpuguard.proving.simulator`` runs inside a private mount and
network namespace (``unshare -m -n``, started by :func:`start_simulator`).

Details: docs/internals.md, "simulator".
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

GPU_NODES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia-uvm")
WALLET = "4" + "7" * 94  # Monero-shaped (4 + 94 base58 characters); no one's wallet
NV_ESC_RM_ALLOC = (3 << 30) | (48 << 16) | (ord("F") << 8) | 0x2B  # _IOWR('F', 0x2b, 48 bytes)
DEFAULT_POOL_PORT = 3333
DEFAULT_IOCTLS = 2000
_MS_NOSUID, _MS_NOEXEC = 2, 8
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1


def miner_argv(pool_port: int, ioctls: int) -> list[str]:
    """The miner child's command line: what a real miner's looks like."""
    return [
        sys.executable,
        "-m",
        "gpuguard.proving.simulator",
        "miner",
        "--ioctls",
        str(ioctls),
        "-o",
        f"stratum+tcp://127.0.0.1:{pool_port}",
        "-u",
        WALLET,
        "-p",
        "selftest",
        "--donate-level",
        "1",
        "--coin",
        "monero",
    ]


def start_simulator(
    pool_port: int = DEFAULT_POOL_PORT, ioctls: int = DEFAULT_IOCTLS, cgroup: Path | None = None
) -> subprocess.Popen:
    """Start the simulator in new mount and network namespaces (root only); read its ready line next.

    With ``cgroup`` (a cgroup v2 directory) it starts inside that cgroup, so an enforce agent
    scoped to it (:mod:`gpuguard.proving.enforce_scope`) may act on it and on nothing else.
    """
    unshare = shutil.which("unshare")
    if unshare is None:
        from gpuguard.errors import GpuguardError

        raise GpuguardError(
            "unshare(1) is missing, so the simulator cannot get private namespaces",
            "apt-get install util-linux",
        )
    argv = [
        unshare,
        "--mount",
        "--net",
        "--propagation",
        "private",
        sys.executable,
        "-m",
        "gpuguard.proving.simulator",
        "--pool-port",
        str(pool_port),
        "--ioctls",
        str(ioctls),
    ]
    if cgroup is not None:
        # The shell joins the cgroup, then becomes unshare: the simulator is in it from its first instruction.
        argv = [
            "/bin/sh",
            "-c",
            'echo $$ > "$1/cgroup.procs" && shift && exec "$@"',
            "gpuguard-simulator",
            str(cgroup),
            *argv,
        ]
    return subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, close_fds=True
    )


def stop_simulator(sim: subprocess.Popen) -> None:
    """End the simulator (closing its stdin ends the miner too) and wait for it."""
    if sim.stdin:
        sim.stdin.close()
    try:
        sim.wait(10)
    except subprocess.TimeoutExpired:
        sim.kill()
        sim.wait()


def parse_ready(line: str) -> dict[str, float]:
    """``ready pid=1 start=2.5 pool=1`` -> {"pid": 1, "start": 2.5, "pool": 1}."""
    words = line.split()
    if not words or words[0] != "ready":
        raise ValueError(f"unexpected simulator output: {line!r}")
    out: dict[str, float] = {}
    for word in words[1:]:
        key, _, value = word.partition("=")
        out[key] = float(value)
    return out


# ---- inside the namespaces ------------------------------------------------------------


def _private_dev() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if (
        libc.mount(b"gpuguard-selftest", b"/dev", b"tmpfs", _MS_NOSUID | _MS_NOEXEC, b"mode=755")
        != 0
    ):
        raise OSError(ctypes.get_errno(), "mount tmpfs on /dev")
    for node in ("/dev/null",) + GPU_NODES:
        os.mknod(node, 0o666 | 0o020000, os.makedev(1, 3))
        os.chmod(node, 0o666)


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifreq = struct.pack("16sH14s", b"lo", 0, b"")
        flags = struct.unpack("16sH14s", fcntl.ioctl(s, _SIOCGIFFLAGS, ifreq))[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sH14s", b"lo", flags | _IFF_UP, b""))


class LoopbackPool(threading.Thread):
    """A stratum pool on 127.0.0.1 that accepts logins, keeps the sockets and answers nothing.

    ``port`` 0 picks a free port (``self.port``).  The first bytes of each
    client are kept in ``lines``; ``got_line`` is set once one arrived.
    """

    def __init__(self, port: int = 0) -> None:
        super().__init__(daemon=True)
        self.server = socket.create_server(("127.0.0.1", port))
        self.port = self.server.getsockname()[1]
        self.lines: list[bytes] = []
        self.got_line = threading.Event()
        self.clients: list[socket.socket] = []

    def run(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.clients.append(conn)
            conn.settimeout(5)
            try:
                data = conn.recv(4096)
            except OSError:
                continue
            if data:
                self.lines.append(data)
                self.got_line.set()

    def close(self) -> None:
        for conn in self.clients:
            conn.close()
        self.server.close()


def _simulate(pool_port: int, ioctls: int) -> int:
    _private_dev()
    _loopback_up()
    pool = LoopbackPool(pool_port)
    pool.start()
    started = time.time()
    miner = subprocess.Popen(miner_argv(pool_port, ioctls), stdin=subprocess.PIPE, close_fds=True)
    logged_in = pool.got_line.wait(10)
    print(f"ready pid={miner.pid} start={started:.6f} pool={int(logged_in)}", flush=True)
    try:
        sys.stdin.read()  # until the selftest closes our stdin
    finally:
        miner.terminate()
        try:
            miner.wait(5)
        except subprocess.TimeoutExpired:
            miner.kill()
    return 0


def _miner(argv: list[str]) -> int:
    """The miner child: GPU opens, an ioctl burst, a pool login, then quiet."""
    signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(0))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: never outlive the simulator
    ioctls = int(argv[argv.index("--ioctls") + 1])
    url = argv[argv.index("-o") + 1]
    host, _, port = url.split("://", 1)[1].rpartition(":")
    fds = [os.open(node, os.O_RDWR) for node in GPU_NODES]
    buf = bytearray(48)
    for _ in range(ioctls):
        try:
            fcntl.ioctl(fds[0], NV_ESC_RM_ALLOC, buf)
        except OSError:
            pass  # ENOTTY from the null device: the call was still made
    pool = socket.create_connection((host, int(port)), timeout=5)
    pool.sendall(
        b'{"id":1,"jsonrpc":"2.0","method":"login","params":{"login":"'
        + WALLET.encode()
        + b'","pass":"selftest","agent":"XMRig/6.21.0 (selftest)"}}\n'
    )
    pool.sendall(b'{"id":2,"method":"mining.subscribe","params":["XMRig/6.21.0"]}\n')
    sys.stdin.read()  # quiet until the simulator ends us
    return 0


def main(argv: list[str]) -> int:
    if argv and argv[0] == "miner":
        return _miner(argv[1:])
    port = int(argv[argv.index("--pool-port") + 1]) if "--pool-port" in argv else DEFAULT_POOL_PORT
    ioctls = int(argv[argv.index("--ioctls") + 1]) if "--ioctls" in argv else DEFAULT_IOCTLS
    return _simulate(port, ioctls)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
