"""quarantine and the cgroup egress block on real cgroups, and pinned blocks across a restart."""

from __future__ import annotations

import socket
import time
from dataclasses import replace
from pathlib import Path

import pytest

from gpuguard.respond import Responder
from gpuguard.respond.blocks import BlockStore
from tests.support.respond import ask, cleanup, settings_for_test, start_probe, state_of, verdict_for

pytestmark = pytest.mark.root


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
        assert ask(target, "/dev/null") == "OK"        # other devices still open; it keeps running
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
        responder = Responder(replace(settings, actions={"malicious": ("quarantine", "block-egress")}), mode="enforce")
        state = state_of(target.pid, connections=(("127.0.0.2", pool_port), ("127.0.0.3", other_port)))
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
