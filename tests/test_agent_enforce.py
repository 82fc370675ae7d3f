"""The response layer inside the running agent: enforce mode end to end, guard policies, block expiry.

Every enforce agent here is confined to a cgroup made for the test
(:class:`gpuguard.proving.enforce_scope.EnforceScope`: ``/gg-test-<pid>-<n>``, its
own pin root and block records, no host-wide nftables sets): other suites run
on this machine, and the agent must not act on their processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuguard.proving.enforce_scope import EnforceScope
from gpuguard.proving.simulator import parse_ready, start_simulator, stop_simulator
from gpuguard.respond.cgroup_blocks import cgroup2_mount
from tests.support.agent_run import REPO, AgentProcess, finding_for
from tests.support.workloads import build_workload, run_with_gpu_nodes

pytestmark = [pytest.mark.root, pytest.mark.self_contained]


def _config(tmp_path: Path, text: str) -> Path:
    os.chmod(tmp_path, 0o700)
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    path.chmod(0o600)
    return path


def _action(pid: int, action: str, status: str):
    return lambda r: (
        r.get("gpuguard", {}).get("kind") == "action"
        and r["gpuguard"].get("action") == action
        and r["gpuguard"].get("status") == status
        and r.get("process", {}).get("pid") == pid
    )


def _blocks(scope: EnforceScope) -> list[dict]:
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuguard",
            "blocks",
            "--json",
            "--pin-root",
            str(scope.pin_root),
            "--state-dir",
            str(scope.state_dir),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    return [json.loads(line) for line in run.stdout.splitlines()]


def _alive(pid: int) -> bool:
    """Running (a killed miner stays a zombie until the simulator reaps it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _ready_pid(sim: subprocess.Popen) -> int:
    line = sim.stdout.readline().decode()
    return int(parse_ready(line)["pid"])


def test_enforce_agent_kills_the_miner_in_its_scope_and_only_there(tmp_path):
    with EnforceScope(tmp_path) as scope:
        # kill-on-touch entries expire after 6 s, so the agent's housekeeping sweep must lift them
        config = _config(
            tmp_path,
            "mode: enforce\nsensor: ebpf\n"
            + scope.response_section()
            + "  kill_on_touch: {ttl_s: 6}\n",
        )
        agent = AgentProcess(tmp_path, "--config", str(config))
        try:
            agent.wait_ready()
            outside = start_simulator()  # not in the scope: found, never acted on
            try:
                outside_pid = _ready_pid(outside)
                agent.wait_record(finding_for(outside_pid), timeout=20)
                refused = agent.wait_record(_action(outside_pid, "kill", "refused"), timeout=10)
                assert "outside the response scope" in refused["message"] + json.dumps(
                    refused["gpuguard"]
                )
                assert _alive(outside_pid)
            finally:
                stop_simulator(outside)

            inside = start_simulator(cgroup=scope.cgroup)
            try:
                miner = _ready_pid(inside)
                killed = agent.wait_record(_action(miner, "kill", "done"), timeout=20)
                assert killed["gpuguard"]["verdict"] == "malicious"
                touch = agent.wait_record(_action(miner, "kill-on-touch", "done"), timeout=5)
                deadline = time.monotonic() + 10
                while _alive(miner) and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert not _alive(miner), "the miner survived the kill"
            finally:
                stop_simulator(inside)
            blocks = _blocks(scope)
            entry = [b for b in blocks if b["kind"] == "kill-on-touch" and b["pid"] == miner]
            assert entry and entry[0]["in_place"] == "in kernel map", blocks
            egress = [b for b in blocks if b["kind"] == "block-egress" and b["pid"] == miner]
            assert egress and egress[0]["in_place"] == "attached", (
                blocks
            )  # lifted when the scope closes
            assert touch["gpuguard"].get("block_id") in (None, entry[0]["id"])
            # housekeeping (every 10 s) lifts the expired entry and logs it
            lifted = agent.wait_record(
                lambda r: (
                    r.get("gpuguard", {}).get("action") == "unblock" and "expired" in json.dumps(r)
                ),
                timeout=30,
            )
            assert lifted["gpuguard"]["status"] == "done"
            assert not [b for b in _blocks(scope) if b["kind"] == "kill-on-touch"]
        finally:
            assert agent.stop() == 0, agent.stderr()
        stopped = [r for r in agent.records() if r.get("event", {}).get("action") == "stop"]
        assert stopped and "actions" in stopped[-1]["message"]
    assert not scope.cgroup.exists() and not scope.pin_root.exists()


def test_guard_policy_breach_is_one_finding_per_breach(tmp_path):
    config = _config(
        tmp_path,
        "sensor: ebpf\nguard_policies:\n"
        "  - {id: gpu-owners, allowed_users: [nobody-else], verdict: suspicious}\n",
    )
    agent = AgentProcess(tmp_path, "--config", str(config))
    try:
        agent.wait_ready()
        workload = run_with_gpu_nodes(
            [str(build_workload()), "open:/dev/nvidia0", "sleep:9000", "exit:0"]
        )
        try:

            def guard(r):
                return (
                    finding_for(workload.pid)(r)
                    and r.get("rule", {}).get("id") == "guard.gpu-owners"
                )

            found = agent.wait_record(guard, timeout=20)
            assert "user root is not allowed on GPU [0]" in json.dumps(found)
            run = agent.status()["run_id"]  # this agent run's: record ids differ across restarts
            assert found["gpuguard"]["finding"]["run_id"] == run
            assert (
                found["event"]["id"] == f"{found['gpuguard']['finding']['id']}-{run}-0"
            )  # its own
            time.sleep(5)  # two more evaluations: no new line while the breach is unchanged
            assert len([r for r in agent.records() if guard(r)]) == 1
            # monitor mode: the alert is the only action, and it names the policy
            agent.wait_record(
                lambda r: (
                    r.get("gpuguard", {}).get("kind") == "action"
                    and r.get("process", {}).get("pid") == workload.pid
                    and "guard.gpu-owners" in json.dumps(r)
                ),
                timeout=5,
            )
        finally:
            workload.kill()
            workload.wait()
    finally:
        assert agent.stop() == 0, agent.stderr()


def test_selftest_own_enforce_agent_acts_only_on_its_simulator(tmp_path):
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuguard",
            "selftest",
            "--own-agent",
            "--mode",
            "enforce",
            "--state-file",
            str(tmp_path / "none.json"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=180,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.startswith(
        "PASS: agent started for the test (sensor ebpf, acting only in cgroup /gpuguard-selftest-"
    ), run.stdout
    assert "; response: " in run.stdout
    scope = run.stdout.split("acting only in cgroup /", 1)[1].split(")", 1)[0]
    assert not (Path("/sys/fs/bpf") / scope).exists()  # its pin root is removed
    assert not (Path(cgroup2_mount()) / scope).exists()  # and its cgroup
