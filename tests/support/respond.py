"""Helpers for the response tests: settings in private places, verdicts about real processes.

Every test gets its own bpffs root (/sys/fs/bpf/gpuguard-test-<pid>-<n>), state
directory and quarantine cgroup parent, and :func:`cleanup` lifts whatever is
left so parallel suites never see each other's blocks.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from gpuguard.correlate.state import ProcessKey, ProcessState
from gpuguard.detect.scoring.score import Evidence, Verdict
from gpuguard.respond.actions.kill_on_touch import touch_program
from gpuguard.respond.blocks import BlockStore
from gpuguard.respond.cgroup_blocks import cgroup2_mount
from gpuguard.respond.lift import lift_all
from gpuguard.respond.responder import Responder
from gpuguard.respond.settings import ResponseSettings
from gpuguard.respond.touch.blocker import TouchBlocker
from gpuguard.sources.proc.process import collect_process_facts

_COUNTER = itertools.count()

# Stand-ins for an offender: one that exits on SIGTERM, and a miner-like one that
# ignores it, so only SIGKILL after the grace period ends it.
SLEEPER = "import time; print('up', flush=True); time.sleep(600)"
STUBBORN = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('up', flush=True); time.sleep(600)"
)


def start_offender(code: str = STUBBORN) -> subprocess.Popen:
    """A real process running ``code``, returned once it is up."""
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "up"
    return proc


def stop_offender(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()


# Nodes with the real GPU majors (no driver here: open fails with ENXIO unless a
# device program refuses it first with EPERM).
_REAL_MAJOR_DEV_SCRIPT = r"""
set -e
mount --make-rprivate / 2>/dev/null || true
mount -t tmpfs -o mode=755 gpuguard-test-dev /dev
mknod -m 666 /dev/null c 1 3
mkdir -p /dev/dri
mknod -m 666 /dev/nvidia0 c 195 0
mknod -m 666 /dev/nvidiactl c 195 255
mknod -m 666 /dev/dri/renderD128 c 226 128
exec "$@"
"""

# Reads paths (open), "connect HOST PORT" or "fork-open PATH" lines on stdin; prints OK or the errno
# name for each (for fork-open, how the child that tried the open ended).
PROBE_PROGRAM = r"""
import errno, os, socket, sys
print("ready", flush=True)
for line in sys.stdin:
    words = line.split()
    try:
        if words[0] == "fork-open":      # a child opens the path; report how the child ended
            child = os.fork()
            if child == 0:
                try:
                    os.close(os.open(words[1], os.O_RDWR))
                    os._exit(0)
                except BaseException:
                    os._exit(1)
            status = os.waitpid(child, 0)[1]
            print(f"child-signal-{os.WTERMSIG(status)}" if os.WIFSIGNALED(status)
                  else f"child-exit-{os.WEXITSTATUS(status)}", flush=True)
            continue
        if words[0] == "connect":
            s = socket.create_connection((words[1], int(words[2])), timeout=2); s.close()
        else:
            os.close(os.open(words[0], os.O_RDWR))
        print("OK", flush=True)
    except OSError as e:
        print(errno.errorcode.get(e.errno, str(e.errno)), flush=True)
"""


def settings_for_test(**changes) -> ResponseSettings:
    n = next(_COUNTER)
    tag = f"{os.getpid()}-{n}"
    base = ResponseSettings(
        pin_root=f"/sys/fs/bpf/gpuguard-test-{tag}",
        state_dir=f"/tmp/gpuguard-test-blocks-{tag}",
        quarantine_parent=os.path.join(cgroup2_mount(), f"gg-test-{tag}"),
        kill_grace_s=0.5,
        nftables=False,
    )
    return replace(base, **changes)


def touch_of(responder: Responder) -> TouchBlocker | None:
    """The kill-on-touch program the responder has loaded (None: no block needed it yet)."""
    return responder.parts.loaded(touch_program)


def cleanup(settings: ResponseSettings) -> None:
    store = BlockStore(settings.state_dir)
    lift_all(
        store, Path(settings.pin_root), {settings.nftables_netns} if settings.nftables else set()
    )
    shutil.rmtree(settings.pin_root, ignore_errors=True)
    shutil.rmtree(settings.state_dir, ignore_errors=True)
    parent = Path(settings.quarantine_parent)
    if parent.is_dir():
        for child in parent.iterdir():
            if child.is_dir():
                try:
                    child.rmdir()
                except OSError:
                    pass
        try:
            parent.rmdir()
        except OSError:
            pass


def state_of(pid: int, connections: tuple[tuple[str, int], ...] = ()) -> ProcessState:
    facts = collect_process_facts(pid)
    assert facts is not None and facts.start_time, f"pid {pid} is gone"
    state = ProcessState(key=ProcessKey(pid, facts.start_time))
    state.set_facts(facts)
    for address, port in connections:
        state.add_connection(address, port)
    return state


def verdict_for(
    state: ProcessState,
    verdict: str = "malicious",
    *,
    comm: str | None = None,
    evidence: list[Evidence] | None = None,
    allowlisted: bool = False,
) -> Verdict:
    evidence = (
        evidence
        if evidence is not None
        else [
            Evidence(
                "miner.stratum_port",
                "connect_ports",
                "connect_ports=3333 (in_list pool_ports)",
                60,
                "high",
            )
        ]
    )
    return Verdict(
        key=state.key,
        pid=state.pid,
        comm=comm if comm is not None else state.comm,
        exe=state.exe,
        score=90 if verdict == "malicious" else 50,
        verdict=verdict,
        evidence=evidence,
        allowlisted=allowlisted,
        time=time.time(),
    )


def private_dev_with_real_majors(argv: list[str]) -> list[str]:
    return [
        shutil.which("unshare") or "unshare",
        "-m",
        "--propagation",
        "private",
        "sh",
        "-c",
        _REAL_MAJOR_DEV_SCRIPT,
        "gpuguard-test",
        *argv,
    ]


def start_probe(real_majors: bool = False) -> subprocess.Popen:
    """A process that opens paths / connects on request and reports the result (see PROBE_PROGRAM)."""
    import sys

    argv = [sys.executable, "-c", PROBE_PROGRAM]
    if real_majors:
        argv = private_dev_with_real_majors(argv)
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def ask(proc: subprocess.Popen, line: str) -> str:
    proc.stdin.write(line + "\n")
    proc.stdin.flush()
    return proc.stdout.readline().strip()


def process_state_letter(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]
