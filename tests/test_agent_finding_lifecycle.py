"""A process finding over its life, in the running agent: one id, coalesced updates, a close.

A miner-shaped workload (tests/workloads/gpu_workload.c) is malicious at exec from its
command line alone; later it opens GPU-named device nodes (a private /dev, see
tests/support/workloads.py) and logs in to a loopback pool
(:class:`tests.support.randomx.LoopbackPool`), then ends.  The agent (eBPF sensor) must
write, for one finding id, the create, an update carrying the pool destination and the GPU
evidence, and a close with the lifetime totals; updates at most one per interval; and
enforce mode acting once per escalation, not on every update.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from gpuguard.outputs.records import FORMATS
from gpuguard.proving.enforce_scope import EnforceScope
from tests.support.agent_run import AgentProcess, actions_on
from tests.support.cgroup_start import in_cgroup
from tests.support.randomx import LoopbackPool
from tests.support.schemas import ecs_errors, ocsf_errors, strict_cef
from tests.support.shared_agent import UPDATE_INTERVAL_S
from tests.support.workloads import build_workload, private_dev_command

pytestmark = [pytest.mark.root, pytest.mark.self_contained]

WALLET = "4" + "7" * 94  # Monero-shaped; no one's wallet
INTERVAL_S = UPDATE_INTERVAL_S  # findings.update_interval_s of these agents (and the shared one)


def _login(port: int) -> str:
    login = {
        "id": 1,
        "jsonrpc": "2.0",
        "method": "login",
        "params": {"login": WALLET, "pass": "x", "agent": "XMRig/6.21.0"},
    }
    return (json.dumps(login) + "\n").encode().hex()


def _config(tmp_path: Path, extra: str = "") -> Path:
    os.chmod(tmp_path, 0o700)
    path = tmp_path / "agent.yaml"
    path.write_text(
        f"sensor: ebpf\nfindings: {{update_interval_s: {INTERVAL_S:g}}}\n"
        "sessions: {watch_score: 20}\n" + extra
    )
    path.chmod(0o600)
    return path


def _start(steps: list[str], miner_args: list[str], cgroup: Path | None = None):
    """The workload with GPU-named nodes; ``miner_args`` follow ``exit:0`` (never run as steps)."""
    command, env = private_dev_command([str(build_workload()), *steps, "exit:0", *miner_args])
    command = in_cgroup(command, cgroup)
    proc = subprocess.Popen(
        command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout.readline().strip() == b"ready", proc.stderr.read()[-400:]
    return proc


def _go(proc: subprocess.Popen) -> None:
    """Let the workload past its next ``ready`` step."""
    proc.stdin.write(b"go\n")
    proc.stdin.flush()


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)


def _of(pid: int, activity: str | None = None):
    def match(r: dict[str, Any]) -> bool:
        g = r.get("gpuguard", {})
        return (
            g.get("kind") == "process"
            and r.get("process", {}).get("pid") == pid
            and "finding" in g
            and (activity is None or g["finding"]["activity"] == activity)
        )

    return match


def _records(agent: AgentProcess, pid: int) -> list[dict[str, Any]]:
    return [r for r in agent.records() if _of(pid)(r)]


def _epoch(record: dict[str, Any]) -> float:
    from datetime import datetime

    return datetime.fromisoformat(record["@timestamp"].replace("Z", "+00:00")).timestamp()


def test_a_miner_gets_one_finding_id_an_update_with_pool_and_gpu_and_a_close(
    tmp_path, shared_agent
):
    """On the agent this test process shares: every assertion is about the miner's own pid."""
    pool = LoopbackPool(tmp_path, tls=False, push_s=(600.0, 600.0))
    agent = shared_agent
    miner = None
    try:
        miner = _start(
            # the GPU opens and the pool login come 1 s apart: one coalesced update carries both
            ["ready", "open:/dev/nvidia0", "open:/dev/nvidiactl", "sleep:1000"]
            + [f"connect:127.0.0.1:{pool.port}", f"send:2:{_login(pool.port)}", "ready"],
            ["-o", f"stratum+tcp://127.0.0.1:{pool.port}", "-u", WALLET, "--donate-level", "1"],
        )
        pid = miner.pid
        create = agent.wait_record(_of(pid, "create"), timeout=30)
        assert create["gpuguard"]["verdict"] == "malicious", create["gpuguard"]
        fid = create["gpuguard"]["finding"]["id"]
        _go(miner)  # GPU, then the pool

        def with_pool_and_gpu(r: dict[str, Any]) -> bool:
            return (
                _of(pid, "update")(r)
                and r.get("destination", {}).get("port") == pool.port
                and "/dev/nvidia0" in r["gpuguard"].get("gpu", {}).get("device_paths", [])
            )

        update = agent.wait_record(with_pool_and_gpu, timeout=40)
        assert update["gpuguard"]["finding"]["id"] == fid
        run = agent.status()["run_id"]  # this agent run's: record ids differ across restarts
        # ECS expects no `change` under intrusion_detection: the update is `info`, and says
        # what it is in gpuguard.finding.activity (tests/test_output_schemas.py checks the pairs)
        assert update["event"]["type"] == ["info"] and update["event"]["id"] == f"{fid}-{run}-1"
        assert update["gpuguard"]["finding"]["activity"] == "update"
        assert "intrusion_detection" in update["event"]["category"]
        assert update["destination"]["ip"] == "127.0.0.1"
        assert {"gpu", "destination", "rules"} <= set(update["gpuguard"]["finding"]["changes"])
        assert "net-pool-protocol" in update["gpuguard"]["rule_ids"]
        # the name and hash are the workload's (read after exec), not the launching shell's
        workload = build_workload()
        assert update["process"]["name"] in (workload.name, workload.name[:15])  # not "sh"
        assert update["process"]["executable"] == str(workload)
        assert (
            update["process"]["hash"]["sha256"] == hashlib.sha256(workload.read_bytes()).hexdigest()
        )
        assert update["gpuguard"]["ancestors"][0]["pid"] == os.getpid()  # its parent: this test
        _go(miner)  # it ends
        assert miner.wait(timeout=10) == 0
        close = agent.wait_record(_of(pid, "close"), timeout=20)
    finally:
        if miner is not None:
            _stop(miner)
        pool.close()
    assert close["gpuguard"]["finding"]["id"] == fid
    assert close["event"]["type"] == ["info"] and close["event"]["action"] == "process-ended"
    assert close["gpuguard"]["finding"]["activity"] == "close"
    assert close["process"]["exit_code"] == 0
    totals = close["gpuguard"]["finding"]["totals"]
    assert 0 < totals["gpu_s"] <= totals["age_s"]
    assert totals["destination"] == f"127.0.0.1:{pool.port}"
    assert [a["action"] for a in totals["actions"]] == ["alert"]  # monitor mode: the alert alone
    records = _records(agent, pid)
    assert [r["event"]["id"] for r in records] == [f"{fid}-{run}-{n}" for n in range(len(records))]
    assert records[0] == create and records[-1] == close
    # the GPU opens and the login, a second apart, gave one update: none carries only the GPU
    first_gpu = next(r for r in records if "gpu" in r["gpuguard"]["finding"].get("changes", []))
    assert "destination" in first_gpu["gpuguard"]["finding"]["changes"]
    _assert_rate_limited(records)
    for record in agent.records():
        assert ecs_errors(record) == [], record.get("event", {}).get("action")


def _assert_rate_limited(records: list[dict[str, Any]]) -> None:
    """Updates of one finding come at most one per interval (escalations and the close aside).

    Measured from update to update: an update's time is when it was written, while the create's
    is the verdict's, which a busy agent writes later (the limit counts from the write; the unit
    tests in test_finding_lifecycle.py check that on a clock they control)."""
    for before, after in zip(records, records[1:], strict=False):
        finding = after["gpuguard"]["finding"]
        if before["gpuguard"]["finding"]["activity"] == "create":
            continue
        if finding["activity"] == "update" and "escalation" not in finding.get("changes", []):
            assert _epoch(after) - _epoch(before) >= INTERVAL_S - 0.1, (before, after)


def test_enforce_acts_once_per_escalation_not_on_every_update(tmp_path):
    pool = LoopbackPool(tmp_path, tls=False, push_s=(600.0, 600.0))
    with EnforceScope(tmp_path) as scope:
        config = _config(
            tmp_path,
            "mode: enforce\n"
            + scope.response_section()
            + "  actions: {suspicious: [alert], malicious: [alert]}\n",
        )
        agent = AgentProcess(tmp_path, "--config", str(config))
        miner = None
        try:
            agent.wait_ready()
            # suspicious at exec (a miner flag from /tmp), malicious at its pool login, then more
            # evidence (a second GPU) that is an update and no escalation
            miner = _start(
                ["ready", "open:/dev/nvidia0", "sleep:500"]
                + [f"connect:127.0.0.1:{pool.port}", f"send:1:{_login(pool.port)}"]
                + ["sleep:1000", "open:/dev/nvidia1", "ready"],
                ["--coin", "monero"],
                cgroup=scope.cgroup,
            )
            pid = miner.pid
            create = agent.wait_record(_of(pid, "create"), timeout=30)
            assert create["gpuguard"]["verdict"] == "suspicious", create["gpuguard"]
            _go(miner)
            agent.wait_record(
                lambda r: _of(pid, "update")(r) and r["gpuguard"]["verdict"] == "malicious",
                timeout=30,
            )
            agent.wait_record(
                lambda r: (
                    _of(pid, "update")(r)
                    and "/dev/nvidia1" in r["gpuguard"].get("gpu", {}).get("device_paths", [])
                ),
                timeout=40,
            )
            _go(miner)
            miner.wait(timeout=10)
            close = agent.wait_record(_of(pid, "close"), timeout=20)
        finally:
            if miner is not None:
                _stop(miner)
            assert agent.stop() == 0, agent.stderr()
            pool.close()
    records = _records(agent, pid)
    escalations = [
        r for r in records if "escalation" in r["gpuguard"]["finding"].get("changes", [])
    ]
    assert [r["gpuguard"]["verdict"] for r in escalations] == ["malicious"]
    assert len(records) >= 4  # create, escalation, the second GPU, close
    actions = actions_on(agent.records(), pid)
    # one alert for the create (suspicious), one for the escalation (malicious), none for updates
    assert [(a["gpuguard"]["action"], a["gpuguard"]["verdict"]) for a in actions] == [
        ("alert", "suspicious"),
        ("alert", "malicious"),
    ], actions
    assert close["gpuguard"]["finding"]["totals"]["actions_total"] == 2
    _assert_rate_limited(records)


def _view(fmt: str, line: str, pid: int) -> dict[str, Any] | None:
    """A finding line about ``pid`` as {activity, id, port, gpu}; None for any other line."""
    if fmt == "ocsf":
        event = json.loads(line)
        process = (event.get("evidences") or [{}])[0].get("process", {})
        if event.get("class_uid") != 2004 or process.get("pid") != pid:
            return None
        activity = {1: "create", 2: "update", 3: "close"}[event["activity_id"]]
        port = (event["evidences"][0].get("dst_endpoint") or {}).get("port")
        gpu = event["unmapped"]["gpuguard"].get("gpu", {}).get("device_paths", [])
        return {"activity": activity, "id": event["finding_info"]["uid"], "port": port, "gpu": gpu}
    header, ext = strict_cef(line)
    if header[4].startswith(("action-", "agent-")) or ext.get("spid") != str(pid):
        return None
    detail = json.loads(ext["cs6"])
    gpu = detail.get("gpu", {}).get("device_paths", [])
    port = int(ext["dpt"]) if "dpt" in ext else None
    return {"activity": detail["activity"], "id": ext["externalId"], "port": port, "gpu": gpu}


@pytest.mark.parametrize("fmt", FORMATS[1:])  # the default (ecs): the test above
def test_the_lifecycle_in_ocsf_and_cef_validates(tmp_path, fmt):
    pool = LoopbackPool(tmp_path, tls=False, push_s=(600.0, 600.0))
    agent = AgentProcess(tmp_path, "--config", str(_config(tmp_path)), "--log-format", fmt)
    miner = None

    def wait(predicate, timeout: float = 40) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in agent.log.read_text(errors="surrogateescape").splitlines():
                view = _view(fmt, line, pid)
                if view is not None and predicate(view):
                    return view
            time.sleep(0.1)
        raise AssertionError(f"no such {fmt} record; stderr: {agent.stderr()}")

    try:
        agent.wait_ready()
        miner = _start(
            ["ready", "open:/dev/nvidia0", f"connect:127.0.0.1:{pool.port}"]
            + [f"send:1:{_login(pool.port)}", "ready"],
            ["-o", f"stratum+tcp://127.0.0.1:{pool.port}", "-u", WALLET, "--donate-level", "1"],
        )
        pid = miner.pid
        create = wait(lambda v: v["activity"] == "create")
        _go(miner)
        update = wait(
            lambda v: v["activity"] == "update" and v["port"] == pool.port and v["gpu"], 40
        )
        _go(miner)
        miner.wait(timeout=10)
        close = wait(lambda v: v["activity"] == "close")
    finally:
        if miner is not None:
            _stop(miner)
        assert agent.stop() == 0, agent.stderr()
        pool.close()
    assert create["id"] == update["id"] == close["id"]
    assert "/dev/nvidia0" in update["gpu"]
    lines = agent.log.read_text(errors="surrogateescape").splitlines()
    for line in lines:
        assert len(line.encode("utf-8", "surrogateescape")) <= 8192
        if fmt == "ocsf":
            assert ocsf_errors(json.loads(line)) == [], line[:300]
        else:
            strict_cef(line)
