"""kill-on-touch: a fresh or renamed copy of a blocked miner dies at its first GPU open, across a restart too.

Every test is scoped to a cgroup it creates (``response.cgroups``) and runs the
blocked programs in it; the same program run outside it lives.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from gpuguard.respond import Responder
from gpuguard.respond.blocks import BlockStore
from gpuguard.respond.bpf_pins import PinnedMap
from tests.support.respond import cleanup, settings_for_test, state_of, touch_of, verdict_for
from tests.support.touch_scope import run_in, scope_cgroup, start_in
from tests.support.workloads import build_workload

pytestmark = [pytest.mark.root, pytest.mark.self_contained]


@pytest.fixture
def scope():
    """The test's cgroup, and settings that act only inside it."""
    with scope_cgroup() as (name, cgroup):
        s = settings_for_test(actions={"malicious": ("kill-on-touch", "kill")}, cgroups=(name,))
        try:
            yield cgroup, s
        finally:
            cleanup(s)


@pytest.fixture
def miner(tmp_path):
    path = tmp_path / "xminer"
    shutil.copy(build_workload(), path)
    return path


def _run(argv: list[str], cgroup: Path | None) -> tuple[int, str]:
    """Run with GPU-named nodes in ``cgroup``; "done" only if every step returned to the program."""
    return run_in(argv, cgroup)[:2]


def _block(settings, miner, outcomes, cgroup):
    offender = start_in([str(miner), "ready", "sleep:60000"], cgroup)
    assert offender.stdout.readline() == b"ready\n"
    responder = Responder(settings, mode="enforce", emit=outcomes.append)
    state = state_of(offender.pid)
    done = responder.respond(verdict_for(state), state, time.time())
    assert [(o.action, o.status) for o in done] == [
        ("alert", "done"),
        ("kill-on-touch", "done"),
        ("kill", "done"),
    ]
    assert offender.wait(timeout=5) == -signal.SIGTERM
    return responder


def test_fresh_and_renamed_copies_die_at_their_gpu_open(scope, miner, tmp_path):
    cgroup, settings = scope
    outcomes = []
    responder = _block(settings, miner, outcomes, cgroup)
    try:
        steps = ["open:/dev/nvidia0"]
        # The test can fail: a different program (one byte more) with the same steps opens and reports.
        other = tmp_path / "other"
        other.write_bytes(miner.read_bytes() + b"\0")
        other.chmod(0o755)
        assert _run([str(other), *steps], cgroup) == (0, "done")
        # A respawn from the same path: blocked at exec, killed at the open, before open returns.
        assert _run([str(miner), *steps], cgroup) == (-signal.SIGKILL, "")
        # It dies at a connect out as well.
        assert _run([str(miner), "connect:127.0.0.1:9"], cgroup)[0] == -signal.SIGKILL
        # A renamed copy (same bytes, new path and inode): matched by sha256 on its exec report.
        renamed = tmp_path / "kworker"
        shutil.copy(miner, renamed)
        assert _run([str(renamed), "sleep:300", *steps], cgroup) == (-signal.SIGKILL, "")
        # Outside the scope the same programs open the GPU.
        assert _run([str(miner), *steps], None) == (0, "done")
        assert _run([str(renamed), "sleep:300", *steps], None) == (0, "done")
        time.sleep(0.3)
        kills = [
            o for o in outcomes if o.action == "kill-on-touch" and o.reason.startswith("killed")
        ]
        assert any("GPU open of /dev/nvidia0" in o.reason for o in kills)
        assert all(o.block_id for o in kills)
    finally:
        responder.close()


def test_blocks_survive_a_new_responder_and_lift(scope, miner):
    cgroup, settings = scope
    first = _block(settings, miner, [], cgroup)
    first.close()  # the agent stops; the maps stay pinned
    outcomes = []
    second = Responder(settings, mode="enforce", emit=outcomes.append)
    try:
        assert _run([str(miner), "open:/dev/nvidia0"], cgroup) == (-signal.SIGKILL, "")
        assert _run([str(miner), "open:/dev/nvidia0"], None) == (0, "done")  # the scope came back
        (block,) = [b for b in BlockStore(settings.state_dir).load() if b.kind == "kill-on-touch"]
        key_size, value_size, offset = block.detail["tgid_layout"]

        def carrying_block():
            with PinnedMap(Path(settings.pin_root) / "maps" / "touch_tgids") as tgids:
                return [
                    k
                    for k, v in tgids.items(key_size, value_size)
                    if int.from_bytes(v[offset : offset + 4], "little") == block.detail["number"]
                ]

        # The offender and the respawn are dead: exits cleared their pid entries.  A live blocked process:
        sleeper = subprocess.Popen(["sleep", "600"])
        try:
            touch = touch_of(second)
            tgids = touch._tgids
            tgids[tgids.Key(sleeper.pid)] = touch._entry(block.detail["number"], 0)
            assert len(carrying_block()) == 1
            assert second.lift(block, time.time()).status == "done"
            assert carrying_block() == []
        finally:
            sleeper.kill()
            sleeper.wait()
        assert _run([str(miner), "open:/dev/nvidia0"], cgroup) == (0, "done")
    finally:
        second.close()


def test_entries_expire_in_the_kernel(scope, miner):
    cgroup, settings = scope
    settings = replace(settings, touch_ttl_s=1.0)
    responder = _block(settings, miner, [], cgroup)
    try:
        assert _run([str(miner), "open:/dev/nvidia0"], cgroup)[0] == -signal.SIGKILL
        time.sleep(1.2)
        assert _run([str(miner), "open:/dev/nvidia0"], cgroup) == (0, "done")
        lifted = responder.sweep(time.time())
        assert [o.action for o in lifted] == ["unblock"] and "expired" in lifted[0].reason
    finally:
        responder.close()


def test_shared_executable_blocks_only_the_offender_and_its_children(scope):
    from tests.support.respond import ask, start_probe

    cgroup, settings = scope
    settings = replace(settings, actions={"malicious": ("kill-on-touch",)})
    offender, bystander = start_probe(), start_probe()  # both run the system's python
    for proc in (offender, bystander):
        (cgroup / "cgroup.procs").write_text(str(proc.pid))
    outcomes = []
    responder = Responder(settings, mode="enforce", emit=outcomes.append)
    try:
        state = state_of(offender.pid)
        outcome = responder.respond(verdict_for(state), state, time.time())[-1]
        # python is an interpreter: the block keys on the offender's inline code, never on python
        assert outcome.status == "done" and "never on the interpreter" in outcome.reason
        assert outcome.detail["target"]["kind"] == "script"
        assert outcome.detail["path_key"] is None and outcome.detail["sha256"] is None
        assert ask(bystander, "/dev/nvidia0") == "ENOENT"  # same executable, not blocked
        assert (
            ask(bystander, "fork-open /dev/nvidia0") == "child-exit-1"
        )  # its child: ENOENT, not killed
        # A child forked after the block inherits it (sched_process_fork) and dies at its GPU open.
        assert ask(offender, "fork-open /dev/nvidia0") == "child-signal-9"
        assert ask(offender, "/dev/null") == "OK"  # not a GPU path: lives on
        assert ask(offender, "/dev/nvidia0") == ""  # killed at the open: no answer
        assert offender.wait(timeout=5) == -signal.SIGKILL
        assert ask(bystander, "connect 127.0.0.1 9") in ("ECONNREFUSED", "OK")
        # Both kills are logged, the child named by what the kernel copied from its parent at fork
        # (it was dead before /proc could be read); the command line is bounded in the kernel.
        deadline = time.monotonic() + 10
        while len([o for o in outcomes if "touch" in o.detail]) < 2:
            assert time.monotonic() < deadline, outcomes
            time.sleep(0.05)
        child, parent = [o.detail["victim"] for o in outcomes if "touch" in o.detail]
        assert parent["pid"] == offender.pid and child["pid"] not in (offender.pid, bystander.pid)
        for victim in (child, parent):
            assert victim["exe"] == outcome.exe
            assert victim["cmdline"].startswith(f"{sys.executable} -c ")
            assert victim["cmdline"].endswith(" [truncated]")
    finally:
        responder.close()
        for proc in (offender, bystander):
            proc.kill()
            proc.wait()


def test_a_blocked_pid_never_blocks_the_process_that_gets_the_number_next(scope):
    from gpuguard.respond.bpf_pins import ensure_pin_root
    from gpuguard.respond.touch.blocker import TouchBlocker

    _, settings = scope
    root = ensure_pin_root(settings.pin_root)
    sleepers = [subprocess.Popen(["sleep", "600"]) for _ in range(3)]
    touch = TouchBlocker(root, lambda report: None)
    try:
        exiting, recycled, kept = sleepers
        entries = touch._tgids
        for proc in sleepers:
            entries[entries.Key(proc.pid)] = touch._entry(7, 0)
        # An exit clears its entry in the kernel.
        exiting.kill()
        exiting.wait()
        time.sleep(0.1)
        assert entries.Key(exiting.pid) not in entries
        # An entry added (as far as the kernel knows) before its process started is a recycled pid.
        stale = touch._entry(7, 0)
        stale.added_ns = 1
        entries[entries.Key(recycled.pid)] = stale
        touch.close()
        touch = TouchBlocker(root, lambda report: None)  # a restart: the check runs at start
        pids = {key.value for key in touch._tgids.keys()}
        assert recycled.pid not in pids and kept.pid in pids
    finally:
        touch.close()
        for proc in sleepers:
            proc.kill()
            proc.wait()
