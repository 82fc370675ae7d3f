"""Benign rounding-mode users (tests/workloads/rounding_benign.c), a job queue for them, and the
throttle a RandomX stand-in runs under: a SIGSTOP/SIGCONT duty cycle (its CPU quota cgroup is
tests/support/load.py's :func:`own_cpu_group`).

:func:`start_benign` installs the workload under an ordinary path (INSTALL_DIR, beside the
RandomX stand-ins: not a temporary directory, which a rule would count) and starts it in the
load group (tests/support/load.py), optionally moved into a cgroup v2 directory of the test's
(an enforce scope).  :class:`JobQueue` answers each line a worker sends with one line and never
pushes.  :class:`DutyCycle` stops and continues a process from a thread, as cpulimit does.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
from pathlib import Path

from tests.support.load import join_load_group
from tests.support.randomx import INSTALL_DIR, LoopbackServer
from tests.support.workloads import build_c_program

SOURCE = Path(__file__).resolve().parent.parent / "workloads" / "rounding_benign.c"


class JobQueue(LoopbackServer):
    """A job queue on 127.0.0.1: one short reply per line (work on NEXT, OK otherwise)."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: dict[str, int] = {}  # first word -> lines received (DONE, BEAT, NEXT)
        self.start()

    def _session(self, conn: socket.socket) -> None:
        jobs = 0
        with conn:
            buffer = b""
            while not self._stop.is_set():
                try:
                    data = conn.recv(4096)
                except OSError:
                    return
                if not data:
                    return
                buffer += data
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    word = line.split(b" ", 1)[0].decode(errors="replace")
                    self.lines[word] = self.lines.get(word, 0) + 1
                    jobs += word == "NEXT"
                    conn.sendall(
                        b"JOB %d seed=%d\n" % (jobs, jobs * 7919) if word == "NEXT" else b"OK\n"
                    )


def start_benign(
    mode: str,
    name: str,
    *,
    queue: JobQueue | None = None,
    heartbeat_s: float = 30.0,
    cgroup_v2: Path | None = None,
) -> subprocess.Popen:
    """Install the workload as INSTALL_DIR/name and run ``mode`` (see the C file), in the load
    group and, with ``cgroup_v2``, in that cgroup v2 directory; return it once "ready"."""
    binary = build_c_program(SOURCE, flags=("-frounding-math", "-pthread"), libs=("-lm",))
    INSTALL_DIR.mkdir(parents=True, exist_ok=True)
    exe = INSTALL_DIR / name
    tmp = exe.with_name(f".{name}.{os.getpid()}")
    shutil.copy2(binary, tmp)
    tmp.rename(exe)
    argv = [str(exe), mode] + ([str(queue.port), f"{heartbeat_s:g}"] if queue else [])
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    join_load_group(proc.pid, huge_pages=False)
    if cgroup_v2 is not None:
        (cgroup_v2 / "cgroup.procs").write_text(str(proc.pid))
    if proc.stdout.readline().strip() != b"ready":
        proc.kill()
        proc.wait()
        raise RuntimeError(f"{mode} did not start: {proc.stderr.read().decode()[-400:]}")
    return proc


def cpu_time_s(pid: int) -> float:
    """User + system CPU seconds ``pid`` has used (0 when gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class DutyCycle:
    """SIGSTOP and SIGCONT to a process this test started, ``on_s`` running and ``off_s``
    stopped in turn (cpulimit's way of capping CPU), from a thread until :meth:`stop`."""

    def __init__(self, proc: subprocess.Popen, on_s: float = 0.1, off_s: float = 0.1) -> None:
        self.proc, self.on_s, self.off_s = proc, on_s, off_s
        self.stops = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        # the Popen stays unreaped while this runs, so its pid cannot name another process
        while not self._stop.wait(self.on_s) and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGSTOP)
            self.stops += 1
            self._stop.wait(self.off_s)
            self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
