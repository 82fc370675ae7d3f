"""Record ids across agent restarts (the real agent, eBPF sensor, ``kill -9`` and a restart).

A miner-shaped workload that runs through the restart keeps its finding id (the restarted
agent continues the finding, its records numbered on), but no record repeats an ``event.id``
of the run before, and the record that picks the finding up says so (``continued``).  A
miner first seen by the restarted agent is a new finding, not a continued one.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.agent_run import AgentProcess
from tests.support.workloads import build_workload

pytestmark = [pytest.mark.root, pytest.mark.self_contained]

WALLET = "4" + "9" * 94  # Monero-shaped; no one's wallet


def _miner() -> subprocess.Popen:
    return subprocess.Popen(
        [str(build_workload()), "sleep:600000", "exit:0"]
        + ["-o", "stratum+tcp://127.0.0.1:3333", "-u", WALLET, "--donate-level", "1"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )


def _of(pid: int, activity: str = "create", continued: bool | None = None):
    def match(r: dict[str, Any]) -> bool:
        finding = r.get("gpuguard", {}).get("finding")
        return (
            r.get("gpuguard", {}).get("kind") == "process"
            and r.get("process", {}).get("pid") == pid
            and finding is not None
            and finding["activity"] == activity
            and (continued is None or bool(finding.get("continued")) == continued)
        )

    return match


def _agent(workdir: Path) -> AgentProcess:
    return AgentProcess(workdir, "--sensor", "ebpf")


def test_a_restarted_agent_continues_the_finding_under_new_record_ids(tmp_path):
    os.chmod(tmp_path, 0o700)
    miner = _miner()
    newcomer = None
    first = _agent(tmp_path)
    try:
        first.wait_ready()
        before = first.wait_record(_of(miner.pid), timeout=30)
        first.proc.kill()  # kill -9: no stop line, nothing flushed on the way out
        first.proc.wait(timeout=10)
        second = _agent(tmp_path)
        try:
            second.wait_ready()
            after = second.wait_record(_of(miner.pid, continued=True), timeout=30)
            newcomer = _miner()
            fresh = second.wait_record(_of(newcomer.pid), timeout=30)
            miner.kill()
            second.wait_record(_of(miner.pid, "close"), timeout=30)
        finally:
            if newcomer is not None:
                newcomer.kill()
                newcomer.wait(timeout=10)
            assert second.stop() == 0, second.stderr()
    finally:
        first.stop()
        miner.kill()
        miner.wait(timeout=10)
    print(f"event.id of pid {miner.pid} before the restart: {before['event']['id']}")
    print(f"event.id of pid {miner.pid} after the restart:  {after['event']['id']}")
    finding, again = before["gpuguard"]["finding"], after["gpuguard"]["finding"]
    assert again["id"] == finding["id"]  # the same finding, continued
    assert after["event"]["id"] != before["event"]["id"]
    assert "continued" not in finding and again["continued"] is True
    assert again["run_id"] != finding["run_id"]
    assert after["event"]["id"] == f"{again['id']}-{again['run_id']}-{again['sequence']}"
    assert again["sequence"] > finding["sequence"]  # numbered on from the run before
    assert not fresh["gpuguard"]["finding"].get("continued")  # new to both runs: a new finding
    assert fresh["gpuguard"]["finding"]["sequence"] == 0
    ids = [r["event"]["id"] for r in second.records() if r.get("event", {}).get("id")]
    assert len(ids) == len(set(ids)), "an event.id was written twice across the restart"
