"""Enforce mode acts on the offender's own identity: never an interpreter, a shared file, a recycled
pid, or anything outside its scope.

Every test is scoped to a cgroup it creates (response.cgroups) and proves that what runs
outside it, or what only shares a file with the offender, lives on and connects.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from gpuguard.respond import Responder
from gpuguard.respond.cgroup_blocks import cgroup2_mount
from gpuguard.respond.touch.target import Script, interpreter_family, script_of
from tests.support.cgroup_start import in_cgroup
from tests.support.respond import cleanup, settings_for_test, state_of, verdict_for
from tests.support.workloads import build_workload

SYSTEM_PYTHON = os.path.realpath("/usr/bin/python3")
CONNECT = (
    "import socket, sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=5)"
    ".close(); print('connected', flush=True)"
)
MINER_SCRIPT = (
    "import socket, sys, time\n"
    "print('up', flush=True)\n"
    "sys.stdin.readline()\n"
    "socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=5).close()\n"
    "print('connected', flush=True)\n"
)


# -- what is an interpreter, and what it runs (no root needed) -----------------------------------


@pytest.mark.parametrize(
    ("path", "family"),
    [
        (SYSTEM_PYTHON, "python"),
        ("/bin/bash", "shell"),
        ("/bin/dash", "shell"),
        ("/usr/bin/perl", "perl"),
    ],
)
def test_interpreters_are_known_by_their_elf(path, family):
    if not os.path.exists(path):
        pytest.skip(f"{path} is not installed here")
    assert interpreter_family(path) == family


def test_a_renamed_interpreter_is_still_one_and_a_plain_program_is_not(tmp_path):
    renamed = tmp_path / "kworker"
    shutil.copy(SYSTEM_PYTHON, renamed)
    assert interpreter_family(str(renamed)) == "python"  # the name is not what decides
    assert interpreter_family("/bin/true") is None
    assert interpreter_family(str(build_workload())) is None
    script = tmp_path / "x.sh"
    script.write_text("#!/bin/sh\necho esac elif\n")
    assert interpreter_family(str(script)) is None  # not an ELF


def test_the_script_in_an_interpreters_argv(tmp_path):
    (tmp_path / "cwd").mkdir()
    (tmp_path / "cwd" / "m.py").write_text("print(1)\n")
    root = str(tmp_path)  # stands for /proc/PID: cwd/ and root/ under it
    os.symlink("/", tmp_path / "root")
    by_file = script_of("python", ["python3", "-u", "-W", "ignore", "m.py", "--url", "x"], root)
    assert by_file.kind == "file" and by_file.path.endswith("/cwd/m.py") and by_file.sha256
    inline = script_of("python", ["python3", "-c", "print(2)"], root)
    assert inline == script_of("python", ["other-name", "-cprint(2)"], root)
    assert inline.kind == "inline" and inline.sha256 and inline.path == ""
    assert script_of("shell", ["sh", "-c", "echo hi"], root).kind == "inline"
    assert script_of("python", ["python3", "-m", "http.server"], root) == Script(
        "unknown", "http.server"
    )
    assert script_of("python", ["python3"], root).kind == "unknown"


# -- the real kernel ------------------------------------------------------------------------------


@pytest.fixture
def scope(tmp_path):
    """A cgroup for the test and the response settings that act only inside it."""
    name = f"/gg-ident-{os.getpid()}-{time.monotonic_ns() % 100000}"
    cgroup = Path(cgroup2_mount() + name)
    cgroup.mkdir()
    settings = settings_for_test(actions={"malicious": ("kill-on-touch",)}, cgroups=(name,))
    yield cgroup, settings
    cleanup(settings)
    for top, _, _ in os.walk(cgroup, topdown=False):
        directory = Path(top)
        if (directory / "cgroup.procs").read_text().strip():
            (directory / "cgroup.kill").write_text("1")
            time.sleep(0.2)
        directory.rmdir()


@pytest.fixture
def listener():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    yield server.getsockname()[1]
    server.close()


def _start(argv: list[str], cgroup: Path | None = None, **kwargs) -> subprocess.Popen:
    """A process that is in ``cgroup`` (when given) from its first instruction."""
    return subprocess.Popen(
        in_cgroup(argv, cgroup), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, **kwargs
    )


def _runs_and_connects(argv: list[str], cgroup: Path | None = None) -> tuple[int, str]:
    proc = _start(argv, cgroup)
    out, _ = proc.communicate(timeout=20)
    return proc.returncode, out


@pytest.mark.root
@pytest.mark.self_contained
def test_a_scripted_offender_under_a_copied_interpreter_blocks_its_script_never_the_interpreter(
    tmp_path, scope, listener
):
    cgroup, settings = scope
    srv = tmp_path / "srv"
    srv.mkdir()
    interpreter = srv / "python3"  # outside every shared_exe_prefix, like a pyenv or conda one
    shutil.copy(SYSTEM_PYTHON, interpreter)
    miner = srv / "miner.py"
    miner.write_text(MINER_SCRIPT)
    offender = _start([str(interpreter), str(miner), str(listener)], cgroup)
    assert offender.stdout.readline().strip() == "up"
    outcomes: list = []
    responder = Responder(settings, mode="enforce", emit=outcomes.append)
    try:
        state = state_of(offender.pid)
        (placed,) = [
            o
            for o in responder.respond(verdict_for(state), state, time.time())
            if o.action == "kill-on-touch"
        ]
        assert placed.status == "done", placed.reason
        assert placed.detail["target"]["kind"] == "script"
        assert placed.detail["target"]["script"]["path"] == str(miner)
        assert "never on the interpreter" in placed.reason
        # The offender itself dies at its connect.
        offender.stdin.write("go\n")
        offender.stdin.flush()
        assert offender.wait(timeout=10) == -signal.SIGKILL
        # The same interpreter running anything else, in scope and out of it, lives and connects;
        # so does the system python with the very same bytes.
        for argv, where in [
            ([str(interpreter), "-c", CONNECT, str(listener)], cgroup),
            ([str(interpreter), "-c", CONNECT, str(listener)], None),
            ([SYSTEM_PYTHON, "-c", CONNECT, str(listener)], cgroup),
            ([SYSTEM_PYTHON, "-c", CONNECT, str(listener)], None),
        ]:
            assert _runs_and_connects(argv, where) == (0, "connected\n"), (argv, where)
        # The blocked script outside the scope lives too; inside it, it is killed at exec.
        outside = _start([SYSTEM_PYTHON, str(miner), str(listener)])
        assert outside.stdout.readline().strip() == "up"
        outside.stdin.write("go\n")
        outside.stdin.flush()
        assert outside.stdout.readline().strip() == "connected" and outside.wait(10) == 0
        again = _start([str(interpreter), str(miner), str(listener)], cgroup)
        assert again.wait(timeout=10) == -signal.SIGKILL
        time.sleep(0.3)
        kills = [o for o in outcomes if o.action == "kill-on-touch" and o.status == "done"]
        assert {o.pid for o in kills} == {offender.pid, again.pid}  # nobody else
        (at_exec,) = [o for o in kills if o.pid == again.pid]
        assert at_exec.detail["victim"]["cmdline"].endswith(f"miner.py {listener}")
        assert at_exec.detail["touch"] == "exec" and "blocked script" in at_exec.reason
    finally:
        responder.close()
        for proc in (offender,):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.mark.root
@pytest.mark.self_contained
def test_a_renamed_copy_of_a_native_offender_dies_at_exec_in_scope_and_lives_outside(
    tmp_path, scope, listener
):
    cgroup, settings = scope
    miner = tmp_path / "xminer"
    shutil.copy(build_workload(), miner)
    offender = _start([str(miner), "ready", "sleep:60000"], cgroup)
    assert offender.stdout.readline().strip() == "ready"
    outcomes: list = []
    responder = Responder(settings, mode="enforce", emit=outcomes.append)
    try:
        state = state_of(offender.pid)
        (placed,) = [
            o
            for o in responder.respond(verdict_for(state), state, time.time())
            if o.action == "kill-on-touch"
        ]
        assert placed.status == "done" and placed.detail["target"]["kind"] == "executable"
        renamed = tmp_path / "kworker-renamed"
        shutil.copy(miner, renamed)  # another inode, the same bytes
        connect = ["connect:127.0.0.1:" + str(listener), "exit:0"]
        assert _runs_and_connects([str(renamed), *connect]) == (0, "")  # outside: lives
        # The blocked path itself (the kernel's path match) outside the scope lives and connects.
        assert _runs_and_connects([str(miner), *connect]) == (0, "")
        copy = _start([str(renamed), "ready", "sleep:60000"], cgroup)
        assert copy.wait(timeout=10) == -signal.SIGKILL  # inside: killed at exec
        time.sleep(0.3)
        (record,) = [o for o in outcomes if o.pid == copy.pid]
        assert record.status == "done" and record.exe == str(renamed)
        assert record.detail["victim"]["exe"] == str(renamed)
        assert record.detail["victim"]["cmdline"] == f"{renamed} ready sleep:60000"
        assert record.detail["touch"] == "exec" and "same sha256" in record.reason
    finally:
        responder.close()
        offender.kill()
        offender.wait()


@pytest.mark.root
@pytest.mark.self_contained
def test_a_recycled_pid_is_never_signalled_nor_its_exe_blocked(tmp_path, scope):
    from gpuguard.events.model import Exec
    from gpuguard.sources.ebpf.probe_source import ProbeSettings
    from gpuguard.sources.ebpf.sensor import Sensor

    cgroup, settings = scope
    settings = replace(settings, actions={"malicious": ("kill-on-touch", "kill")})
    miner = tmp_path / "quick-miner"
    shutil.copy(build_workload(), miner)
    with Sensor(ProbeSettings(), drain_interval=0.1) as sensor:
        offender = _start([str(miner), "ready", "exit:0"], cgroup)
        assert offender.stdout.readline().strip() == "ready"
        state = state_of(offender.pid)  # what the agent knew about it while it ran
        deadline = time.monotonic() + 10
        while state.exit_gen is None and time.monotonic() < deadline:
            for event in sensor.poll(50):
                if isinstance(event, Exec) and event.pid == offender.pid:
                    state.exit_gen = event.exit_gen
        assert state.exit_gen is not None
        verdict = verdict_for(state)
        pid = offender.pid
        offender.stdin.write("go\n")
        offender.stdin.close()
        assert offender.wait(timeout=5) == 0
        # A benign process takes the number within milliseconds (forced through ns_last_pid).
        benign = None
        for _ in range(50):
            Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))
            candidate = subprocess.Popen(["/bin/sleep", "60"], cwd="/")
            if candidate.pid == pid:
                benign = candidate
                break
            candidate.kill()
            candidate.wait()
        assert benign is not None, "could not recycle the pid"
        (cgroup / "cgroup.procs").write_text(str(benign.pid))  # in scope: only identity saves it
        responder = Responder(settings, mode="enforce", generations=sensor.exit_generations)
        try:
            outcomes = responder.respond(verdict, state, time.time())
            acted = {o.action: o for o in outcomes if o.action != "alert"}
            assert {o.status for o in acted.values()} == {"skipped"}, outcomes
            assert all("offender exited" in o.reason for o in acted.values())
            time.sleep(0.5)
            assert benign.poll() is None  # never signalled
            assert responder.store.load() == []  # and /bin/sleep was never blocked
            assert _runs_and_connects(["/bin/sleep", "0"], cgroup) == (0, "")
        finally:
            responder.close()
            benign.kill()
            benign.wait()


@pytest.mark.root
@pytest.mark.self_contained
def test_exact_copies_are_the_offenders_own_and_other_files_at_its_path_trip_the_breaker(
    tmp_path, scope, listener
):
    cgroup, settings = scope
    settings = replace(settings, breaker_victims_per_minute=2)
    miner = tmp_path / "xminer"
    shutil.copy(build_workload(), miner)
    offender = _start([str(miner), "ready", "sleep:60000"], cgroup)
    assert offender.stdout.readline().strip() == "ready"
    outcomes: list = []
    responder = Responder(settings, mode="enforce", emit=outcomes.append)
    connect = ["connect:127.0.0.1:" + str(listener), "exit:0"]
    try:
        state = state_of(offender.pid)
        responder.respond(verdict_for(state), state, time.time())
        offender.kill()
        offender.wait()
        # Respawns of the offender (its very file, renamed copies): its own, however many.
        for n in range(4):
            copy = tmp_path / f"copy{n}"
            shutil.copy(miner, copy)
            respawn = _start([str(copy), "ready", "sleep:60000"], cgroup)  # killed at its exec
            assert respawn.wait(timeout=10) == -signal.SIGKILL
            assert _runs_and_connects([str(miner), *connect], cgroup)[0] == -signal.SIGKILL
        time.sleep(0.3)
        assert not [o for o in outcomes if o.status == "suspended"]
        # Another program put at the blocked path is no copy: three such kills in a minute
        # (more than 2) trip the breaker, and then nothing more is killed.
        miner.unlink()
        shutil.copy(SYSTEM_PYTHON, miner)
        ends = []
        for _ in range(5):
            ends.append(_runs_and_connects([str(miner), "-c", CONNECT, str(listener)], cgroup)[0])
            time.sleep(0.3)  # the kill report reaches user space (the breaker counts there)
        time.sleep(0.3)
        assert ends == [-signal.SIGKILL] * 3 + [0, 0]
        (tripped,) = [o for o in outcomes if o.status == "suspended"]
        assert len(tripped.detail["victims"]) == 3
        (block,) = responder.store.load()
        assert block.detail["suspended"] is True
        others = [o for o in outcomes if o.status == "done" and "breaker" in o.reason]
        assert len(others) == 3  # each of those kills says it was counted
    finally:
        responder.close()
        if offender.poll() is None:
            offender.kill()
            offender.wait()


def test_python_stays_usable(listener):
    """The tests above leave no block behind: the system python connects."""
    assert _runs_and_connects([sys.executable, "-c", CONNECT, str(listener)]) == (0, "connected\n")


@pytest.mark.root
@pytest.mark.self_contained
def test_a_pidfd_is_opened_at_the_exec_and_closed_at_the_exit(tmp_path):
    """The correlator's identity at first sight: a pidfd proven by the exec's exit generation."""
    from gpuguard.correlate.correlator import Correlator
    from gpuguard.events.model import Exec, Exit
    from gpuguard.sources.ebpf.probe_source import ProbeSettings
    from gpuguard.sources.ebpf.sensor import Sensor
    from gpuguard.sources.proc.config_files import attach_config_files
    from gpuguard.sources.proc.identity import first_sight, pidfd_alive
    from gpuguard.sources.proc.process import collect_process_facts

    with Sensor(ProbeSettings(), drain_interval=0.1) as sensor:
        correlator = Correlator(
            facts_provider=collect_process_facts,
            config_reader=attach_config_files,
            identify=first_sight(sensor.exit_generations),
        )
        proc = _start([str(build_workload()), "ready", "exit:0"])
        assert proc.stdout.readline().strip() == "ready"
        seen: list = []
        deadline = time.monotonic() + 10
        while not seen and time.monotonic() < deadline:
            seen = [e for e in sensor.poll(50) if isinstance(e, Exec) and e.pid == proc.pid]
        correlator.feed(seen[0])
        state = correlator.state_of(proc.pid)
        assert state.exit_gen == seen[0].exit_gen and state.pidfd is not None
        assert pidfd_alive(state.pidfd)
        held = state.pidfd
        proc.stdin.write("go\n")
        proc.stdin.close()
        assert proc.wait(timeout=5) == 0
        exits: list = []
        deadline = time.monotonic() + 10
        while not exits and time.monotonic() < deadline:
            exits = [e for e in sensor.poll(50) if isinstance(e, Exit) and e.pid == proc.pid]
        correlator.feed(exits[0])
        assert state.pidfd is None
        with pytest.raises(OSError):
            os.fstat(held)  # closed: no descriptor is kept for a process that is gone


LEADER_EXIT_C = r"""
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>
static void *work(void *arg) { (void)arg; for (;;) pause(); return 0; }
int main(void) {
    pthread_t t;
    pthread_create(&t, 0, work, 0);
    printf("ready\n");
    fflush(stdout);
    pthread_exit(0);  /* the leader leaves; the process mines on in its worker */
}
"""


@pytest.mark.root
@pytest.mark.self_contained
def test_a_leader_that_calls_pthread_exit_is_still_reached(tmp_path, scope):
    """Only the group's death moves the exit generation: a miner cannot look exited to dodge a kill."""
    from gpuguard.events.model import Exec
    from gpuguard.sources.ebpf.probe_source import ProbeSettings
    from gpuguard.sources.ebpf.sensor import Sensor

    cgroup, settings = scope
    settings = replace(settings, actions={"malicious": ("kill",)})
    source = tmp_path / "leader_exit.c"
    source.write_text(LEADER_EXIT_C)
    binary = tmp_path / "leader-exit"
    subprocess.run(["gcc", "-O2", "-pthread", "-o", str(binary), str(source)], check=True)
    with Sensor(ProbeSettings(), drain_interval=0.1) as sensor:
        proc = _start([str(binary)], cgroup)
        assert proc.stdout.readline().strip() == "ready"
        state = state_of(proc.pid)
        deadline = time.monotonic() + 10
        while state.exit_gen is None and time.monotonic() < deadline:
            for event in sensor.poll(50):
                if isinstance(event, Exec) and event.pid == proc.pid:
                    state.exit_gen = event.exit_gen
        time.sleep(0.2)  # the leader has left by now; its worker runs on
        responder = Responder(settings, mode="enforce", generations=sensor.exit_generations)
        try:
            (kill,) = [
                o
                for o in responder.respond(verdict_for(state), state, time.time())
                if o.action == "kill"
            ]
            assert kill.status == "done", kill.reason
            assert proc.wait(timeout=10) in (-signal.SIGTERM, -signal.SIGKILL)
        finally:
            responder.close()
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.mark.root
@pytest.mark.self_contained
def test_no_kernel_entry_outlives_the_process_it_was_put_in_for(tmp_path):
    """An entry that lands after its process exited would block the pid's next owner: none stays."""
    from gpuguard.respond.bpf_pins import ensure_pin_root
    from gpuguard.respond.touch.blocker import TouchBlocker

    settings = settings_for_test()
    touch = TouchBlocker(ensure_pin_root(settings.pin_root), lambda report: None)
    try:
        gone = subprocess.Popen(["/bin/true"])
        gone.wait()
        zombie = subprocess.Popen(["/bin/true"])
        deadline = time.monotonic() + 5
        while Path(f"/proc/{zombie.pid}/stat").read_text().split(") ")[1][0] != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        pidfd = os.pidfd_open(zombie.pid)  # its exit already ran the kernel's cleanup
        try:
            assert not touch._insert_live(zombie.pid, touch._entry(5, 0), pidfd)
        finally:
            os.close(pidfd)
        assert not touch._insert_live(gone.pid, touch._entry(5, 0))
        live = subprocess.Popen(["/bin/sleep", "60"])
        assert touch._insert_live(live.pid, touch._entry(5, 0))
        keys = {key.value for key in touch._tgids.keys()}
        assert live.pid in keys and zombie.pid not in keys and gone.pid not in keys
        live.kill()
        live.wait()
        zombie.wait()
    finally:
        touch.close()
        cleanup(settings)
