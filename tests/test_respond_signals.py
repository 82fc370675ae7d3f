"""kill, suspend, the safety guard, the rate limit, dry-run and monitor mode, on real processes."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import replace
from pathlib import Path

import pytest

from gpuguard.correlate.state import ProcessKey
from gpuguard.respond import Responder
from gpuguard.respond.blocks import BlockStore
from tests.support.respond import (
    SLEEPER,
    cleanup,
    process_state_letter,
    settings_for_test,
    start_offender,
    state_of,
    stop_offender,
    verdict_for,
)

pytestmark = [pytest.mark.root, pytest.mark.self_contained]


@pytest.fixture
def settings():
    s = settings_for_test(actions={"clean": (), "suspicious": ("alert",), "malicious": ("kill",)})
    yield s
    cleanup(s)


def test_miner_like_process_is_killed_after_ignoring_sigterm(settings):
    outcomes = []
    proc = start_offender()
    try:
        responder = Responder(settings, mode="enforce", emit=outcomes.append)
        state = state_of(proc.pid)
        returned = responder.respond(verdict_for(state), state, time.time())
        assert [(o.action, o.status) for o in returned] == [("alert", "done"), ("kill", "done")]
        assert proc.wait(timeout=5) == -signal.SIGKILL
        responder.close()
        assert any(o.detail.get("signal") == "SIGKILL" for o in outcomes)
    finally:
        stop_offender(proc)


def test_suspended_process_stays_stopped_until_unblocked(settings):
    settings = replace(settings, actions={"malicious": ("suspend",)})
    proc = start_offender()
    try:
        responder = Responder(settings, mode="enforce")
        state = state_of(proc.pid)
        outcome = responder.respond(verdict_for(state), state, time.time())[-1]
        assert (outcome.action, outcome.status) == ("suspend", "done")
        time.sleep(0.5)
        assert process_state_letter(proc.pid) == "T" and proc.poll() is None
        # Something else resumes it (its parent, say): the next sweep stops it again.
        os.kill(proc.pid, signal.SIGCONT)
        time.sleep(0.2)
        assert process_state_letter(proc.pid) != "T"
        (again,) = responder.sweep(time.time())
        assert (again.action, again.status) == (
            "suspend",
            "done",
        ) and "stopped again" in again.reason
        time.sleep(0.2)
        assert process_state_letter(proc.pid) == "T"
        assert responder.sweep(time.time()) == []
        block = BlockStore(settings.state_dir).get(outcome.block_id)
        assert block.kind == "suspend"
        assert responder.lift(block, time.time()).status == "done"
        time.sleep(0.2)
        assert process_state_letter(proc.pid) in ("S", "R")
        responder.close()
    finally:
        stop_offender(proc)


def test_recycled_pid_is_not_signalled(settings):
    proc = start_offender()
    try:
        responder = Responder(settings, mode="enforce")
        state = state_of(proc.pid)
        # The verdict was about an earlier process with the same pid: its start time differs.
        old = verdict_for(state)
        old.key = ProcessKey(proc.pid, state.key.start_time - 30.0)
        outcome = responder.respond(old, state, time.time())[-1]
        assert (outcome.action, outcome.status) == ("kill", "skipped")
        assert "started at" in outcome.reason
        time.sleep(0.8)
        assert proc.poll() is None and process_state_letter(proc.pid) != "T"
        responder.close()
    finally:
        stop_offender(proc)


def test_dry_run_and_monitor_mode_change_nothing(settings):
    settings = replace(
        settings,
        actions={"malicious": ("kill", "suspend", "kill-on-touch", "quarantine", "block-egress")},
    )
    proc = start_offender()
    try:
        state = state_of(proc.pid, connections=(("192.0.2.7", 3333),))
        dry = Responder(settings, mode="enforce", dry_run=True).respond(
            verdict_for(state), state, time.time()
        )
        assert {o.action: o.status for o in dry if o.action != "alert"} == {
            "kill": "dry-run",
            "suspend": "dry-run",
            "kill-on-touch": "dry-run",
            "quarantine": "dry-run",
            "block-egress": "dry-run",
        }
        assert "192.0.2.7" in next(o for o in dry if o.action == "block-egress").reason
        monitor = Responder(settings, mode="monitor").respond(
            verdict_for(state), state, time.time()
        )
        assert [(o.action, o.status) for o in monitor] == [("alert", "done")]
        assert (
            "enforce mode would: kill-on-touch, quarantine, block-egress, suspend, kill"
            in monitor[0].reason
        )
        time.sleep(0.8)
        assert proc.poll() is None and process_state_letter(proc.pid) != "T"
        assert not Path(settings.pin_root).exists() and BlockStore(settings.state_dir).load() == []
    finally:
        stop_offender(proc)


def test_guard_refuses_protected_processes(settings):
    responder = Responder(settings, mode="enforce")
    for pid in (1, os.getpid(), os.getppid()):
        state = state_of(pid)
        outcome = responder.respond(verdict_for(state), state, time.time())[-1]
        assert outcome.status == "refused", pid
    proc = start_offender()
    try:
        state = state_of(proc.pid)
        allowed = responder.respond(verdict_for(state, allowlisted=True), state, time.time())
        assert all(o.action == "alert" for o in allowed)  # allowlisted: at most an alert
        scoped = Responder(replace(settings, scope="containers"), mode="enforce")
        outcome = scoped.respond(verdict_for(state), state, time.time())[-1]
        assert outcome.status == "refused" and "containers only" in outcome.reason
        elsewhere = Responder(replace(settings, cgroups=("/gg-nowhere",)), mode="enforce")
        assert elsewhere.respond(verdict_for(state), state, time.time())[-1].status == "refused"
        protected = Responder(replace(settings, protect_exes=(state.exe,)), mode="enforce")
        assert protected.respond(verdict_for(state), state, time.time())[-1].status == "refused"
        time.sleep(0.3)
        assert proc.poll() is None
    finally:
        stop_offender(proc)


def test_action_storm_degrades_to_alerts(settings):
    settings = replace(settings, max_actions_per_minute=2)
    procs = [start_offender(SLEEPER) for _ in range(3)]
    try:
        responder = Responder(settings, mode="enforce")
        now = time.time()
        last = [
            responder.respond(verdict_for(state_of(p.pid)), state_of(p.pid), now)[-1] for p in procs
        ]
        assert [o.status for o in last] == ["done", "done", "rate-limited"]
        assert "degraded to an alert" in last[2].reason
        assert procs[0].wait(timeout=5) == -signal.SIGTERM and procs[2].poll() is None
        # A minute later the budget is back.
        again = responder.respond(
            verdict_for(state_of(procs[2].pid)), state_of(procs[2].pid), now + 61
        )[-1]
        assert again.status == "done"
        responder.close()
    finally:
        for p in procs:
            stop_offender(p)


def test_scope_by_cgroup_reads_the_live_cgroup_v2_path(settings):
    from gpuguard.respond.cgroup_blocks import cgroup2_mount

    scope = f"/gg-test-scope-{os.getpid()}"
    directory = Path(cgroup2_mount() + scope)
    directory.mkdir()
    inside, outside = start_offender(), start_offender()
    try:
        (directory / "cgroup.procs").write_text(str(inside.pid))
        responder = Responder(replace(settings, cgroups=(scope,)), mode="enforce")
        acted = responder.respond(
            verdict_for(state_of(inside.pid)), state_of(inside.pid), time.time()
        )[-1]
        assert acted.status == "done", acted.reason
        spared = responder.respond(
            verdict_for(state_of(outside.pid)), state_of(outside.pid), time.time()
        )[-1]
        assert spared.status == "refused"
        assert inside.wait(timeout=5) == -signal.SIGKILL and outside.poll() is None
        responder.close()
    finally:
        stop_offender(inside)
        stop_offender(outside)
        for _ in range(50):
            try:
                directory.rmdir()
                break
            except OSError:
                time.sleep(0.05)
