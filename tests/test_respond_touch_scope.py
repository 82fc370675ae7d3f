"""kill-on-touch holds its scope in the kernel, logs every kill once, and stops itself when it hits others.

Each test creates a cgroup (and a child of it), scopes the response to it
(``response.cgroups``) and proves that the same blocked program run outside it
lives, while inside it, or in the child cgroup, it dies at its exec, GPU open
or connect.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import time
import types
from dataclasses import replace
from pathlib import Path

import pytest

from gpuguard.agent.counters import AgentCounters
from gpuguard.agent.stages.s5_report.findings import ProcessFindings
from gpuguard.agent.stages.s6_act import record_outcomes
from gpuguard.cli import main
from gpuguard.outputs.metrics import AgentMetrics
from gpuguard.respond import Responder
from gpuguard.respond.cgroup_blocks import cgroup2_mount, cgroup2_of
from gpuguard.respond.touch.maps import FLAG_SUSPENDED
from tests.support.prometheus import exposition
from tests.support.respond import cleanup, settings_for_test, state_of, touch_of, verdict_for
from tests.support.touch_scope import run_in, scope_cgroup, start_in
from tests.support.workloads import build_workload

pytestmark = [pytest.mark.root, pytest.mark.self_contained]


@pytest.fixture
def scope():
    """A cgroup with a child cgroup, and response settings that act only inside the cgroup."""
    with scope_cgroup() as (name, cgroup):
        settings = settings_for_test(actions={"malicious": ("kill-on-touch",)}, cgroups=(name,))
        try:
            yield cgroup, settings
        finally:
            cleanup(settings)


@pytest.fixture
def listener():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    yield server.getsockname()[1]
    server.close()


@pytest.fixture
def miner(tmp_path):
    path = tmp_path / "xminer"
    shutil.copy(build_workload(), path)
    return path


def _block(settings, miner, cgroup, outcomes):
    offender = start_in([str(miner), "ready", "sleep:60000"], cgroup)
    assert offender.stdout.readline() == b"ready\n"
    responder = Responder(settings, mode="enforce", emit=outcomes.append)
    state = state_of(offender.pid)
    (placed,) = [
        o
        for o in responder.respond(verdict_for(state), state, time.time())
        if o.action == "kill-on-touch"
    ]
    assert placed.status == "done", placed.reason
    offender.kill()
    offender.wait()
    return responder, placed


def _kills(outcomes) -> list:
    return [o for o in outcomes if o.action == "kill-on-touch" and "touch" in o.detail]


def _wait_for(predicate, timeout_s: float = 10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    return predicate()


def test_outside_the_scope_a_blocked_program_lives_inside_it_or_a_child_cgroup_it_dies(
    scope, miner, listener, tmp_path
):
    cgroup, settings = scope
    outcomes: list = []
    responder, placed = _block(settings, miner, cgroup, outcomes)
    gpu = ["open:/dev/nvidia0"]
    connect = [f"connect:127.0.0.1:{listener}"]
    renamed = tmp_path / "kworker"
    shutil.copy(miner, renamed)  # another inode, the same bytes: matched in user space
    try:
        # Outside the scope: the kernel's path match and the user-space sha256 match hold back.
        outside = [
            run_in([str(miner), *gpu, *connect], None),
            run_in([str(renamed), "sleep:300", *gpu, *connect], None),
        ]
        assert [(code, out) for code, out, _ in outside] == [(0, "done")] * 2
        # Inside the scope and in its child cgroup: the same programs die before a step returns.
        inside = {
            "gpu-open": run_in([str(miner), *gpu], cgroup),
            "connect": run_in([str(miner), *connect], cgroup / "inner"),
            "exec": run_in([str(renamed), "sleep:300", *gpu], cgroup / "inner"),
        }
        assert {r: (code, out) for r, (code, out, _) in inside.items()} == {
            r: (-signal.SIGKILL, "") for r in inside
        }
        # Each kill is one record naming the victim, the block and the reason; nobody else has one.
        victims = {pid: reason for reason, (_, _, pid) in inside.items()}
        _wait_for(lambda: {o.pid for o in _kills(outcomes)} >= set(victims))
        time.sleep(0.3)  # a duplicate would have arrived by now
        kills = _kills(outcomes)
        assert sorted(o.pid for o in kills) == sorted(victims)
        for record in kills:
            exe = str(renamed if victims[record.pid] == "exec" else miner)
            assert record.status == "done" and record.block_id == placed.block_id
            assert record.detail["touch"] == victims[record.pid]
            assert record.detail["number"] == placed.detail["number"]
            assert record.detail["victim"]["pid"] == record.pid
            assert record.detail["victim"]["exe"] == exe
            assert record.detail["victim"]["cmdline"].startswith(exe + " ")
        # The agent counts them by reason (the pipeline's own bookkeeping, then the exporter).
        agent = types.SimpleNamespace(
            counters=AgentCounters(), findings=ProcessFindings(), emit=lambda outcome: None
        )
        record_outcomes(agent.counters, agent.findings, agent.emit, outcomes)
        metrics = AgentMetrics()
        metrics.sync_totals(agent.counters.snapshot())
        text = exposition(metrics).decode()
        for reason in ("exec", "gpu-open", "connect"):
            assert f'gpuguard_touch_kills_total{{reason="{reason}"}} 1.0' in text
    finally:
        responder.close()


def test_the_breaker_suspends_a_block_that_kills_others_in_the_kernel_until_rearmed(
    scope, miner, listener
):
    cgroup, settings = scope
    settings = replace(settings, breaker_victims_per_minute=2)
    outcomes: list = []
    responder, placed = _block(settings, miner, cgroup, outcomes)
    number = placed.detail["number"]
    where = ["--pin-root", settings.pin_root, "--state-dir", settings.state_dir]
    # Another program put at the blocked path: no copy of the offender, so each kill is counted.
    other = miner.with_name("other")
    other.write_bytes(miner.read_bytes() + b"\0")
    miner.unlink()
    other.rename(miner)
    miner.chmod(0o755)
    steps = [str(miner), f"connect:127.0.0.1:{listener}"]

    def run_inside() -> int:
        code, _, pid = run_in(steps, cgroup)
        if code == -signal.SIGKILL:  # the breaker counts in user space: let the report arrive
            assert _wait_for(lambda: pid in {o.pid for o in _kills(outcomes)})
        return code

    try:
        assert run_in(steps, None)[:2] == (0, "done")  # outside: lives
        ends = [run_inside() for _ in range(5)]
        assert ends == [-signal.SIGKILL] * 3 + [0, 0]
        (tripped,) = [o for o in outcomes if o.status == "suspended"]
        assert tripped.block_id == placed.block_id and tripped.detail["number"] == number
        killed = [o.pid for o in _kills(outcomes)]
        assert [v["pid"] for v in tripped.detail["victims"]] == killed and len(killed) == 3
        assert all(v["exe"] == str(miner) for v in tripped.detail["victims"])
        # The kernel holds it (every entry of the block reads this state), and so does the record.
        assert touch_of(responder).state_of(number) == FLAG_SUSPENDED
        assert [b.detail.get("suspended") for b in responder.store.load()] == [True]
        # Re-armed: it kills again, and counts afresh.
        assert main(["unblock", "--rearm", placed.block_id, *where]) == 0
        assert touch_of(responder).state_of(number) == 0
        assert run_inside() == -signal.SIGKILL
        assert [o.status for o in outcomes].count("suspended") == 1
        # Lifted: nothing of the block acts any more, and the user-space match stops at once too.
        assert main(["unblock", placed.block_id, *where]) == 0
        assert touch_of(responder).state_of(number) is None
        assert run_inside() == 0
    finally:
        responder.close()


def test_a_block_lifted_while_its_agent_runs_stops_the_user_space_match_too(scope, miner, tmp_path):
    cgroup, settings = scope
    outcomes: list = []
    responder, placed = _block(settings, miner, cgroup, outcomes)
    renamed = tmp_path / "renamed"
    shutil.copy(miner, renamed)
    try:
        assert run_in([str(renamed), "sleep:300"], cgroup)[0] == -signal.SIGKILL
        where = ["--pin-root", settings.pin_root, "--state-dir", settings.state_dir]
        assert main(["unblock", placed.block_id, *where]) == 0  # `gpuguard unblock`, not the agent
        assert run_in([str(renamed), "sleep:300"], cgroup)[:2] == (0, "done")
        assert run_in([str(miner), "open:/dev/nvidia0"], cgroup)[:2] == (0, "done")
    finally:
        responder.close()


def test_scope_containers_acts_in_the_container_cgroups_it_knows(scope, miner):
    cgroup, settings = scope
    settings = replace(settings, scope="containers")  # containers under the test's cgroup only
    first = cgroup / f"docker-{'a1' * 32}.scope"
    later = cgroup / f"docker-{'b2' * 32}.scope"
    first.mkdir()
    outcomes: list = []
    responder, _ = _block(settings, miner, first, outcomes)
    gpu = [str(miner), "open:/dev/nvidia0"]
    try:
        assert run_in(gpu, first)[:2] == (-signal.SIGKILL, "")
        # Not a container (the listed cgroup itself, its other child, the host): lives.
        for where in (cgroup, cgroup / "inner", None):
            assert run_in(gpu, where)[:2] == (0, "done")
        # A container started after the block is outside until the agent's next sweep.
        later.mkdir()
        resident = start_in(["/bin/sleep", "600"], later)  # what makes the cgroup a container's
        try:
            assert _wait_for(lambda: str(resident.pid) in (later / "cgroup.procs").read_text())
            assert run_in(gpu, later)[:2] == (0, "done")
            responder.sweep(time.time())
            assert run_in(gpu, later)[:2] == (-signal.SIGKILL, "")
        finally:
            resident.kill()
            resident.wait()
    finally:
        responder.close()


def test_a_blocked_process_and_its_forks_are_killed_only_while_inside_the_scope(scope):
    from tests.support.respond import ask, start_probe

    cgroup, settings = scope
    home = Path(cgroup2_mount() + cgroup2_of(os.getpid())) / "cgroup.procs"  # outside the scope
    offender = start_probe()
    (cgroup / "cgroup.procs").write_text(str(offender.pid))
    responder = Responder(settings, mode="enforce")
    try:
        state = state_of(offender.pid)
        placed = responder.respond(verdict_for(state), state, time.time())[-1]
        assert placed.action == "kill-on-touch" and placed.status == "done", placed.reason
        # Moved out of the scope, it and the children it forks there open the GPU path and live.
        home.write_text(str(offender.pid))
        assert ask(offender, "fork-open /dev/nvidia0") == "child-exit-1"  # ENOENT, not a kill
        assert ask(offender, "/dev/nvidia0") == "ENOENT"
        # Back in the scope's child cgroup: its fork dies at the open, then it does.
        (cgroup / "inner" / "cgroup.procs").write_text(str(offender.pid))
        assert ask(offender, "fork-open /dev/nvidia0") == "child-signal-9"
        assert ask(offender, "/dev/nvidia0") == ""
        assert offender.wait(timeout=5) == -signal.SIGKILL
    finally:
        responder.close()
        if offender.poll() is None:
            offender.kill()
            offender.wait()
