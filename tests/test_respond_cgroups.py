"""quarantine and the cgroup egress block on real cgroups, and pinned blocks across a restart."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest

from gpuguard.respond import Responder
from gpuguard.respond.blocks import BlockStore
from tests.support.respond import (
    ask,
    cleanup,
    process_state_letter,
    settings_for_test,
    start_probe,
    state_of,
    verdict_for,
)

pytestmark = [pytest.mark.root, pytest.mark.self_contained]


@pytest.fixture
def settings():
    s = settings_for_test()
    yield s
    cleanup(s)


def _stop(*procs) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_quarantined_process_gets_eperm_on_gpu_nodes_while_a_neighbour_does_not(settings):
    settings = replace(settings, actions={"malicious": ("quarantine",)})
    target, neighbour = start_probe(real_majors=True), start_probe(real_majors=True)
    try:
        # No driver here: an allowed open of a 195/226 node fails with ENXIO; the device program makes it EPERM.
        assert ask(target, "/dev/nvidia0") == "ENXIO"
        responder = Responder(settings, mode="enforce")
        state = state_of(target.pid)
        outcome = responder.respond(verdict_for(state), state, time.time())[-1]
        assert (outcome.action, outcome.status) == ("quarantine", "done"), outcome.reason
        assert "remain open" in outcome.reason and outcome.detail["open_gpu_fds"] == 0
        assert outcome.detail["cgroup"].startswith(settings.quarantine_parent)
        for path in ("/dev/nvidia0", "/dev/nvidiactl", "/dev/dri/renderD128"):
            assert ask(target, path) == "EPERM", path
            assert ask(neighbour, path) == "ENXIO", path
        assert ask(target, "/dev/null") == "OK"  # other devices still open; it keeps running
        # The block survives the responder (pinned) and lifts cleanly.
        responder.close()
        assert ask(target, "/dev/nvidia0") == "EPERM"
        again = Responder(settings, mode="enforce")
        block = BlockStore(settings.state_dir).get(outcome.block_id)
        assert again.lift(block, time.time()).status == "done"
        assert ask(target, "/dev/nvidia0") == "ENXIO"
        assert not Path(outcome.detail["cgroup"]).exists()
    finally:
        _stop(target, neighbour)


def _listener(address: str) -> socket.socket:
    sock = socket.socket()
    sock.bind((address, 0))
    sock.listen(8)
    return sock


def test_egress_blocked_cgroup_cannot_reach_the_pool_but_can_reach_others(settings):
    settings = replace(settings, actions={"malicious": ("block-egress",)})
    pool, other = _listener("127.0.0.2"), _listener("127.0.0.3")
    pool_port, other_port = pool.getsockname()[1], other.getsockname()[1]
    settings = replace(settings, quarantine_parent=settings.quarantine_parent)
    target, neighbour = start_probe(), start_probe()
    try:
        # Put the target in its own cgroup first (quarantine does that) so the neighbour is outside it.
        responder = Responder(
            replace(settings, actions={"malicious": ("quarantine", "block-egress")}), mode="enforce"
        )
        state = state_of(
            target.pid, connections=(("127.0.0.2", pool_port), ("127.0.0.3", other_port))
        )
        state.connections.pop(("127.0.0.3", other_port))
        outcomes = responder.respond(verdict_for(state), state, time.time())
        egress = next(o for o in outcomes if o.action == "block-egress")
        assert egress.status == "done", egress.reason
        assert egress.detail["addresses"] == ["127.0.0.2"]
        assert ask(target, f"connect 127.0.0.2 {pool_port}") == "EPERM"
        assert ask(target, f"connect 127.0.0.3 {other_port}") == "OK"
        assert ask(neighbour, f"connect 127.0.0.2 {pool_port}") == "OK"
        block = BlockStore(settings.state_dir).get(egress.block_id)
        assert responder.lift(block, time.time()).status == "done"
        assert ask(target, f"connect 127.0.0.2 {pool_port}") == "OK"
        responder.close()
    finally:
        _stop(target, neighbour)
        pool.close()
        other.close()


@pytest.fixture
def container_cgroup():
    """A cgroup named like a docker container's (the container detection reads the name)."""
    from gpuguard.respond.cgroup_blocks import cgroup2_mount

    parent = Path(cgroup2_mount()) / f"gg-test-ctr-{os.getpid()}"
    scope = parent / f"docker-{os.getpid():064x}.scope"
    scope.mkdir(parents=True)
    yield scope
    for directory in (scope, parent):
        for _ in range(50):
            try:
                directory.rmdir()
                break
            except OSError:
                time.sleep(0.05)


def test_container_is_quarantined_in_place_and_killed_whole(settings, container_cgroup):
    settings = replace(settings, actions={"malicious": ("quarantine",)})
    target, sibling, outsider = (
        start_probe(real_majors=True),
        start_probe(real_majors=True),
        start_probe(real_majors=True),
    )
    try:
        for proc in (target, sibling):
            (container_cgroup / "cgroup.procs").write_text(str(proc.pid))
        state = state_of(target.pid)
        assert state.facts.container_id == f"{os.getpid():064x}"
        responder = Responder(settings, mode="enforce")
        quarantined = responder.respond(verdict_for(state), state, time.time())[-1]
        assert quarantined.status == "done", quarantined.reason
        assert (
            quarantined.detail["cgroup"] == str(container_cgroup)
            and quarantined.detail["created_cgroup"] is False
        )
        # The whole container is quarantined, nothing outside it.
        assert [ask(p, "/dev/nvidia0") for p in (target, sibling, outsider)] == [
            "EPERM",
            "EPERM",
            "ENXIO",
        ]
        # kill with target cgroup: cgroup.kill ends every process of the container, and only those.
        killer = Responder(
            replace(settings, actions={"malicious": ("kill",)}, kill_target="cgroup"),
            mode="enforce",
        )
        outcome = killer.respond(verdict_for(state), state, time.time())[-1]
        assert outcome.status == "done" and outcome.detail["signal"] == "cgroup.kill", (
            outcome.reason
        )
        assert (
            target.wait(timeout=5) == -signal.SIGKILL and sibling.wait(timeout=5) == -signal.SIGKILL
        )
        assert ask(outsider, "/dev/null") == "OK"
        block = BlockStore(settings.state_dir).get(quarantined.block_id)
        assert responder.lift(block, time.time()).status == "done"
        assert container_cgroup.is_dir()  # a container's cgroup is never removed by gpuguard
        responder.close()
        killer.close()
    finally:
        _stop(target, sibling, outsider)


def _alive(pid: int) -> bool:
    try:
        return process_state_letter(pid) != "Z"
    except FileNotFoundError:
        return False


def test_process_group_kill_reaches_every_member(settings):
    settings = replace(settings, actions={"malicious": ("kill",)}, kill_target="group")
    leader = subprocess.Popen(
        ["sh", "-c", "sleep 600 & sleep 600 & echo up; wait"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    bystander = subprocess.Popen(["sleep", "600"])
    try:
        assert leader.stdout.readline().strip() == "up"
        members = [
            int(p)
            for p in subprocess.run(
                ["pgrep", "-g", str(leader.pid)], capture_output=True, text=True
            ).stdout.split()
        ]
        assert len(members) == 3
        responder = Responder(settings, mode="enforce")
        state = state_of(leader.pid)
        outcome = responder.respond(verdict_for(state), state, time.time())[-1]
        assert outcome.status == "done" and outcome.detail["pgid"] == leader.pid
        leader.wait(timeout=5)
        time.sleep(0.3)
        # Dead members may linger as zombies until their new parent reaps them: none may be alive.
        left = subprocess.run(
            ["pgrep", "-g", str(leader.pid)], capture_output=True, text=True
        ).stdout.split()
        assert [p for p in left if _alive(int(p))] == []
        assert bystander.poll() is None
        responder.close()
    finally:
        _stop(leader, bystander)


def test_a_failed_compile_of_the_cgroup_programs_is_tried_once_at_start(settings, monkeypatch):
    # quarantine and block_egress both start by compiling the programs they share; a compile
    # that failed is retried by the first block that needs it, not by the second start hook
    from gpuguard.respond import bpf_pins

    tries = []

    def failing_compile(*args, **kwargs):
        tries.append(args)
        raise OSError("the compiler is missing")

    monkeypatch.setattr(bpf_pins, "compile_program", failing_compile)
    settings = replace(settings, actions={"malicious": ("quarantine", "block_egress")})
    responder = Responder(settings, mode="enforce")
    try:
        assert len(tries) == 1
    finally:
        responder.close()
