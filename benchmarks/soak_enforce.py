"""Enforce soak: a real enforce agent among benign load and respawning miners; nothing benign may die.

    .venv/bin/python benchmarks/soak_enforce.py [--minutes 10] [--out soak_enforce.json]

Root, real kernel.  Not part of CI (it runs for minutes).  The script makes a cgroup of its
own (:class:`gpuguard.proving.enforce_scope.EnforceScope`, ``/gg-soak-<pid>``) and starts
``gpuguard agent`` in enforce mode confined to it (default actions: kill, kill-on-touch,
block-egress; no host-wide nftables sets).  Everything below runs inside that cgroup:

benign
    gcc compiling a small C file, in a loop; Python jobs from the same interpreter the Python
    miners use (one of them opens GPU-named nodes like a training job, each connects to a
    loopback service); bash loops; long-lived Python and bash processes that live the whole
    run; and "recycled" processes: right after an offender dies at pid P, ``ns_last_pid`` is
    set to P - 1 so the next benign process is born as P (it connects out and opens a
    GPU-named node at once, the touches kill-on-touch acts on).
offenders (>= 20 over the run, each respawned after it dies)
    native: tests/workloads/gpu_workload.c built and copied as ``xmrig`` (sometimes a fresh
    path, sometimes the blocked one); Python: a miner-shaped script from the shared
    interpreter; bash: a miner script run by /bin/bash; fileless: the native miner run from a
    memfd (``fexecve``) or from a binary deleted after it started.  Every one has a miner
    command line (stratum URL, Monero-shaped wallet), opens GPU-named nodes (a private mount
    namespace, as the tests do) and logs in to a stratum pool on loopback.

Every process is started straight into the cgroup (it joins it between fork and exec, so
even its first exec is inside). Each benign process is a child of this script, so its own
wait status says whether it died by a signal (a benign process that dies by a signal is a
victim; gcc reports a killed cc1 in its stderr). Each offender's time from start to death is
measured the same way. The summary (stdout and ``--out`` JSON): offenders started / stopped
/ not stopped with time to stop (p50, p99, max), benign processes run / signalled / failed,
pid reuses forced, and circuit-breaker trips (agent records whose message or action names
the breaker). The agent's log is kept beside the summary. Exit status 0 only when >= 20
offenders ran, all were stopped, no benign process was signalled and the breaker never
tripped.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpuguard.proving.enforce_scope import EnforceScope  # noqa: E402
from tests.support.agent_run import AgentProcess  # noqa: E402
from tests.support.workloads import build_workload, private_dev_command  # noqa: E402

WALLET = "4" + "7" * 94  # Monero-shaped; no one's wallet
LOGIN = json.dumps(
    {
        "id": 1,
        "jsonrpc": "2.0",
        "method": "login",
        "params": {"login": WALLET, "pass": "x", "agent": "XMRig/6.21.0"},
    },
    separators=(",", ":"),
)
OFFENDER_KINDS = ("native", "python", "bash", "fileless")
GIVE_UP_S = 90.0  # an offender alive this long was not stopped (the script ends it)

PY_MINER = r"""
import os, socket, sys, time
port = int(sys.argv[1])
fds = [os.open(p, os.O_RDWR) for p in ("/dev/nvidiactl", "/dev/nvidia0")]
s = socket.create_connection(("127.0.0.1", port))
s.sendall(sys.argv[2].encode() + b"\n")
while True:
    time.sleep(1)
"""

BASH_MINER = r"""#!/bin/bash
# a miner-shaped script: $1 pool port, $2 its login line; the rest of its command line is for show
exec 3<>/dev/nvidia0
exec 4<>/dev/tcp/127.0.0.1/$1
printf '%s\n' "$2" >&4
while :; do read -r -t 1 -u 4 _ || true; sleep 1; done
"""

FILELESS = r"""
import os, sys
blob = open(sys.argv[1], "rb").read()
fd = os.memfd_create("kworker", 0)
os.write(fd, blob)
os.execve(fd, ["kworker", *sys.argv[2:]], {})
"""

BENIGN_C = '#include <stdio.h>\nint main(void){long s=0;for(int i=0;i<1000;i++)s+=i;printf("%ld\\n",s);return 0;}\n'

PY_JOB = r"""
import hashlib, os, socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1]))); s.sendall(b"hello\n"); s.close()
h = hashlib.sha256()
for i in range(20000):
    h.update(str(i).encode())
if len(sys.argv) > 2:   # a training-shaped job: it opens the GPU too
    for p in ("/dev/nvidiactl", "/dev/nvidia0"):
        os.close(os.open(p, os.O_RDWR))
"""

PY_LONG = r"""
import socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
for line in sys.stdin:
    pass
s.close()
"""

BASH_LOOP = "for i in $(seq 1 300); do x=$((i * i)); done; echo ok > /dev/null"
BASH_LONG = "while read -r _; do :; done; exit 0"
RECYCLED = r"""
import os, socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1]))); s.close()
os.close(os.open("/dev/nvidia0", os.O_RDWR))
"""


def login_hex() -> str:
    return (LOGIN + "\n").encode().hex()


class Listener:
    """A loopback TCP service that accepts and drains connections (the pool, or a benign service)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(256)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._drain, args=(conn,), daemon=True).start()

    @staticmethod
    def _drain(conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while conn.recv(4096):
                pass
        conn.close()


class Soak:
    def __init__(self, args: argparse.Namespace, scope: EnforceScope, work: Path) -> None:
        self.args = args
        self.scope = scope
        self.work = work
        self.stop = threading.Event()
        self.spawn_lock = threading.Lock()  # one spawn at a time: pid reuse needs it
        self.lock = threading.Lock()
        self.pool = Listener()
        self.service = Listener()
        self.workload = build_workload()
        self.offenders: list[dict] = []
        self.benign: list[dict] = []
        self.recent_offender_pids: list[int] = []
        self.pid_reuse = {"tried": 0, "got": 0}
        self.procs = str(scope.cgroup / "cgroup.procs")
        (work / "benign.c").write_text(BENIGN_C)
        (work / "miner.sh").write_text(BASH_MINER)
        (work / "miner.sh").chmod(0o755)

    # -- spawning ------------------------------------------------------------------------------
    def _enter_scope(self) -> None:
        """In the child, between fork and exec: join the scope cgroup (so its first exec is inside)."""
        fd = os.open(self.procs, os.O_WRONLY)
        try:
            os.write(fd, b"0")
        finally:
            os.close(fd)

    def spawn(self, argv: list[str], *, gpu: bool = False, want_pid: int = 0, **kw):
        env = dict(os.environ)
        if gpu:
            argv, env = private_dev_command(argv)
        with self.spawn_lock:
            if want_pid:
                with contextlib.suppress(OSError):
                    Path("/proc/sys/kernel/ns_last_pid").write_text(str(want_pid - 1))
            kw.setdefault("stdin", subprocess.DEVNULL)
            kw.setdefault("stdout", subprocess.DEVNULL)
            kw.setdefault("stderr", subprocess.PIPE)
            return subprocess.Popen(argv, env=env, preexec_fn=self._enter_scope, **kw)

    # -- offenders -----------------------------------------------------------------------------
    def _offender_argv(self, kind: str, n: int) -> tuple[list[str], Path | None]:
        pool = self.pool.port
        url = f"stratum+tcp://127.0.0.1:{pool}"
        if kind == "python":
            return [
                sys.executable,
                "-c",
                PY_MINER,
                str(pool),
                LOGIN,
                "-o",
                url,
                "-u",
                WALLET,
                "--donate-level",
                "1",
            ], None
        if kind == "bash":
            return [
                "/bin/bash",
                str(self.work / "miner.sh"),
                str(pool),
                LOGIN,
                "-o",
                url,
                "--donate-level",
                "1",
            ], None
        steps = [
            f"sleep:1:{url}",
            f"sleep:1:{WALLET}",
            "open:/dev/nvidiactl",
            "open:/dev/nvidia0",
            f"connect:127.0.0.1:{pool}",
            f"send:2:{login_hex()}",
            "sleep:600000",
        ]
        if kind == "native":
            # Every other respawn reuses the path blocked last time (kill-on-touch); the others
            # are fresh copies.
            exe = self.work / f"native-{n - 2 if (n // 2) % 2 else n}" / "xmrig"
            if not exe.exists():
                exe.parent.mkdir()
                shutil.copy(self.workload, exe)
            return [str(exe), *steps], None
        if n % 2:  # fileless, slot 1: from a memfd
            return [sys.executable, "-c", FILELESS, str(self.workload), *steps], None
        doomed = self.work / f"deleted-{n}" / "kworker"  # slot 0: deleted after it started
        doomed.parent.mkdir()
        shutil.copy(self.workload, doomed)
        return [str(doomed), *steps], doomed

    def offender_loop(self, kind: str, slot: int) -> None:
        n = slot
        while not self.stop.is_set():
            argv, doomed = self._offender_argv(kind, n)
            n += 2
            started = time.monotonic()
            proc = self.spawn(argv, gpu=True)
            if doomed is not None:
                self._unlink_once_running(proc.pid, doomed)
            record = {
                "kind": kind,
                "pid": proc.pid,
                "stopped": False,
                "began": round(time.time(), 3),
            }
            try:
                code = proc.wait(timeout=GIVE_UP_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
                record["given_up"] = True
            record["seconds"] = round(time.monotonic() - started, 3)
            record["returncode"] = code
            err = proc.stderr.read().decode(errors="replace")
            # Killed before its exec: the wrapper shell saw a setup child die by the signal.
            by_shell = code in (128 + 9, 128 + 15) and ("Killed" in err or "Terminated" in err)
            record["stopped"] = (code < 0 or by_shell) and not record.get("given_up")
            if code >= 0:
                record["stderr"] = err[-300:]
            proc.stderr.close()
            with self.lock:
                self.offenders.append(record)
                self.recent_offender_pids.append(proc.pid)
            if self.stop.wait(random.uniform(1.0, 3.0)):
                return

    @staticmethod
    def _unlink_once_running(pid: int, path: Path) -> None:
        """Delete the binary once the process runs it (its exe link names it), or after 5 s."""
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                if os.readlink(f"/proc/{pid}/exe") == str(path):
                    break
            except OSError:
                break
            time.sleep(0.01)
        with contextlib.suppress(OSError):
            path.unlink()

    # -- benign --------------------------------------------------------------------------------
    def run_benign(self, kind: str, argv: list[str], *, gpu: bool = False, want_pid: int = 0):
        began = time.time()
        proc = self.spawn(argv, gpu=gpu, want_pid=want_pid)
        _, err = proc.communicate()
        record = {
            "kind": kind,
            "pid": proc.pid,
            "returncode": proc.returncode,
            "began": round(began, 3),  # epoch seconds, to find it in the agent's log
            "ended": round(time.time(), 3),
        }
        text = err.decode(errors="replace")
        if proc.returncode < 0 or "signal" in text.lower() or "killed" in text.lower():
            record["signalled"] = True
            record["stderr"] = text[-300:]
        elif proc.returncode != 0:
            record["failed"] = True
            record["stderr"] = text[-300:]
        if want_pid:
            record["wanted_pid"] = want_pid
            with self.lock:
                self.pid_reuse["tried"] += 1
                self.pid_reuse["got"] += proc.pid == want_pid
        with self.lock:
            self.benign.append(record)

    def benign_loop(self, kind: str) -> None:
        out = self.work / f"a-{kind}.out"
        port = str(self.service.port)
        while not self.stop.is_set():
            if kind == "gcc":
                self.run_benign("gcc", ["gcc", "-O1", "-o", str(out), str(self.work / "benign.c")])
                pause = 0.5
            elif kind == "python":
                self.run_benign("python", [sys.executable, "-c", PY_JOB, port])
                pause = 0.3
            elif kind == "python-gpu":
                self.run_benign("python-gpu", [sys.executable, "-c", PY_JOB, port, "gpu"], gpu=True)
                pause = 1.0
            elif kind == "bash":
                self.run_benign("bash", ["/bin/bash", "-c", BASH_LOOP])
                pause = 0.3
            else:  # recycled: take the pid of an offender that just died
                with self.lock:
                    pids, self.recent_offender_pids = self.recent_offender_pids, []
                for pid in pids[-3:]:
                    self.run_benign(
                        "recycled",
                        [sys.executable, "-c", RECYCLED, port],
                        gpu=True,
                        want_pid=pid,
                    )
                pause = 0.2
            self.stop.wait(pause)

    def long_lived(self) -> list[tuple[str, subprocess.Popen]]:
        port = str(self.service.port)
        return [
            (
                "python-long",
                self.spawn([sys.executable, "-c", PY_LONG, port], stdin=subprocess.PIPE),
            ),
            ("bash-long", self.spawn(["/bin/bash", "-c", BASH_LONG], stdin=subprocess.PIPE)),
        ]

    def end_long_lived(self, procs: list[tuple[str, subprocess.Popen]]) -> None:
        for kind, proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()
            try:
                code = proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
            record = {"kind": kind, "pid": proc.pid, "returncode": code}
            if code < 0:
                record["signalled"] = True
            elif code != 0:
                record["failed"] = True
            self.benign.append(record)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _mentions_breaker(record: dict) -> bool:
    """An agent record about the circuit breaker (its message or action names it; not a setting)."""
    g, event = record.get("gpuguard", {}), record.get("event", {})
    text = " ".join(
        str(x) for x in (record.get("message", ""), g.get("action", ""), event.get("action", ""))
    ).lower()
    text = text.replace("breaker_victims_per_minute", "")
    return "breaker" in text or "circuit" in text


def summarise(soak: Soak, agent: AgentProcess, seconds: float) -> dict:
    records = agent.records()
    breaker = [r for r in records if _mentions_breaker(r)]
    actions: dict[str, int] = {}
    for r in records:
        g = r.get("gpuguard", {})
        if g.get("kind") == "action":
            key = f"{g.get('action')}:{g.get('status')}"
            actions[key] = actions.get(key, 0) + 1
    offenders = soak.offenders
    stopped = [o for o in offenders if o["stopped"]]
    times = [o["seconds"] for o in stopped]
    by_kind = {
        k: {
            "started": sum(o["kind"] == k for o in offenders),
            "stopped": sum(o["kind"] == k and o["stopped"] for o in offenders),
            "time_to_stop_p50_s": percentile(
                [o["seconds"] for o in stopped if o["kind"] == k], 0.5
            ),
            "time_to_stop_p99_s": percentile(
                [o["seconds"] for o in stopped if o["kind"] == k], 0.99
            ),
        }
        for k in OFFENDER_KINDS
    }
    benign = soak.benign
    benign_kinds = sorted({b["kind"] for b in benign})
    return {
        "seconds": round(seconds, 1),
        "offenders": {
            "started": len(offenders),
            "stopped": len(stopped),
            "not_stopped": [o for o in offenders if not o["stopped"]],
            "by_kind": by_kind,
            "time_to_stop_s": {
                "p50": percentile(times, 0.5),
                "p99": percentile(times, 0.99),
                "max": max(times) if times else None,
                "mean": round(statistics.fmean(times), 3) if times else None,
            },
        },
        "benign": {
            "run": len(benign),
            "by_kind": {k: sum(b["kind"] == k for b in benign) for k in benign_kinds},
            "signalled_by_kind": {
                k: sum(b["kind"] == k and bool(b.get("signalled")) for b in benign)
                for k in benign_kinds
            },
            "signalled": [b for b in benign if b.get("signalled")],
            "failed": [b for b in benign if b.get("failed")],
        },
        "pid_reuse": soak.pid_reuse,
        "circuit_breaker_trips": len(breaker),
        "circuit_breaker_records": [json.dumps(r)[:400] for r in breaker[:5]],
        "agent_actions": actions,
        "agent_alive_at_end": agent.proc.poll() is None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="how long (default 10)")
    parser.add_argument("--out", type=Path, default=Path("soak_enforce.json"), help="JSON summary")
    parser.add_argument("--grace", type=float, default=0.5, help="kill.grace_s for the agent")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("soak_enforce: run as root (it starts an enforce agent)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="gg-soak-"))
    os.chmod(work, 0o700)
    started = time.monotonic()
    with EnforceScope(work, prefix="gg-soak", grace_s=args.grace) as scope:
        config = work / "agent.yaml"
        config.write_text("mode: enforce\nsensor: ebpf\n" + scope.response_section())
        config.chmod(0o600)
        agent = AgentProcess(work, "--config", str(config))
        soak = Soak(args, scope, work)
        threads = []
        long_lived = []
        try:
            agent.wait_ready()
            print(f"soak: agent up (pid {agent.proc.pid}), scope {scope.cgroup}", flush=True)
            long_lived = soak.long_lived()
            for kind in ("gcc", "python", "python-gpu", "bash", "recycled"):
                threads.append(threading.Thread(target=soak.benign_loop, args=(kind,)))
            for kind in OFFENDER_KINDS:
                for slot in (0, 1):
                    threads.append(threading.Thread(target=soak.offender_loop, args=(kind, slot)))
            for t in threads:
                t.start()
            deadline = started + args.minutes * 60
            while time.monotonic() < deadline and agent.proc.poll() is None:
                time.sleep(min(15.0, max(0.1, deadline - time.monotonic())))
                with soak.lock:
                    print(
                        f"soak: {time.monotonic() - started:5.0f} s  offenders "
                        f"{sum(o['stopped'] for o in soak.offenders)}/{len(soak.offenders)} "
                        f"stopped  benign {len(soak.benign)} run, "
                        f"{sum(bool(b.get('signalled')) for b in soak.benign)} signalled",
                        flush=True,
                    )
        finally:
            soak.stop.set()
            for t in threads:
                t.join(timeout=GIVE_UP_S + 30)
            soak.end_long_lived(long_lived)
            summary = summarise(soak, agent, time.monotonic() - started)
            summary["agent_exit"] = agent.stop()
            if summary["agent_exit"] != 0:
                summary["agent_stderr"] = agent.stderr()[-2000:]
        with contextlib.suppress(OSError):
            shutil.copy(agent.log, args.out.with_suffix(".agent.log"))
    shutil.rmtree(work, ignore_errors=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    off, ben = summary["offenders"], summary["benign"]
    print(
        f"offenders: {off['stopped']}/{off['started']} stopped "
        f"(time to stop p50 {off['time_to_stop_s']['p50']} s, p99 {off['time_to_stop_s']['p99']} s)"
    )
    print(f"  by kind: {json.dumps(off['by_kind'])}")
    print(
        f"benign: {ben['run']} run, {len(ben['signalled'])} signalled, {len(ben['failed'])} failed; "
        f"pid reuse forced {summary['pid_reuse']['got']}/{summary['pid_reuse']['tried']}"
    )
    print(f"circuit-breaker trips: {summary['circuit_breaker_trips']}")
    print(f"summary: {args.out} (the agent's log beside it)")
    ok = (
        off["started"] >= 20
        and off["stopped"] == off["started"]
        and not ben["signalled"]
        and summary["circuit_breaker_trips"] == 0
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
