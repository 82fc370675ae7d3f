"""A full log disk under the running agent: every record is in the file or counted in-band.

The agent (eBPF sensor) logs to a small tmpfs of this test's own.  The test fills the disk,
starts miner-shaped workloads (their findings and alerts cannot all be written), frees the
disk and starts more.  The file must then hold every record the agent counted as written,
and ``recovered`` notes whose counts add up to every record it could not write:
written + counted in the notes = produced.  The stop summary counts the failed writes as lost.
"""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from tests.support.agent_run import AgentProcess, lifecycle, until
from tests.support.tmpfs import fill, small_tmpfs
from tests.support.workloads import build_workload

pytestmark = [pytest.mark.root, pytest.mark.self_contained]

WALLET = "4" + "6" * 94  # Monero-shaped; no one's wallet


@pytest.fixture
def log_disk(tmp_path):
    with small_tmpfs(tmp_path / "logfs", "1m", "gg-loggap") as mnt:  # room to spare once freed
        yield mnt


def _miners(count: int) -> list[int]:
    """Short miner-shaped workloads (malicious from their command line once read), run to their end:
    each lives past the exec filter's age (0.5 s) with time to spare for a loaded host's /proc
    read (a plain exec is read only once it lives: docs/agent.md)."""
    procs = [
        subprocess.Popen(
            [str(build_workload()), "sleep:2000", "exit:0"]
            + ["-o", "stratum+tcp://127.0.0.1:3333", "-u", WALLET, "--donate-level", "1"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
        for _ in range(count)
    ]
    for proc in procs:
        assert proc.wait(timeout=20) == 0
    return [p.pid for p in procs]


def _is_note(record: dict) -> bool:
    g = record.get("gpuguard", {})
    return g.get("kind") == "lifecycle" and bool(g.get("detail", {}).get("recovered"))


def _pid_records(records: list[dict], pids: list[int]) -> list[dict]:
    return [
        r
        for r in records
        if r.get("gpuguard", {}).get("kind") in ("process", "action")
        and r.get("process", {}).get("pid") in pids
    ]


def test_a_full_log_disk_leaves_every_lost_record_counted_in_band(tmp_path, log_disk):
    os.chmod(tmp_path, 0o700)
    agent = AgentProcess(tmp_path, "--sensor", "ebpf", log_path=log_disk / "agent.log")
    try:
        agent.wait_ready()
        agent.wait_record(lifecycle("start"))
        # the findings counted so far: other processes on a busy host may have some
        found_before = sum(agent.status()["counters"]["findings"].values())
        filler = fill(log_disk)
        lost_pids = _miners(4)
        # their creates, alerts and closes could not all be written
        until(lambda: agent.status().get("log", {}).get("faults", 0) >= 1, timeout=20)
        until(
            lambda: sum(agent.status()["counters"]["findings"].values()) >= found_before + 4,
            timeout=20,
        )
        time.sleep(2.0)  # the closes (polled every 0.5 s) had their turn on the full disk
        failed = agent.status()["counters"]["output"]["errors"]
        assert failed > 0
        filler.unlink()  # space again
        kept_pids = _miners(2)
        until(
            lambda: all(
                any(
                    r.get("gpuguard", {}).get("finding", {}).get("activity") == "close"
                    for r in _pid_records(agent.records(), [pid])
                )
                for pid in kept_pids
            ),
            timeout=30,
        )
    finally:
        assert agent.stop() == 0, agent.stderr()
    records = agent.records()
    output = agent.status()["counters"]["output"]  # final: written after the log was closed
    notes = [r for r in records if _is_note(r)]
    counted = sum(n["gpuguard"]["detail"]["lost"] for n in notes)
    written = len(records) - len(notes)
    produced = output["lines"] + output["errors"] + output["dropped"] + output["spooled"]
    print(
        f"ENOSPC tally: {written} records in the file + {counted} counted in {len(notes)} "
        f"recovered note(s) = {written + counted}; produced {produced} "
        f"(written {output['lines']}, not written {output['errors']}, queue full {output['dropped']})"
    )
    assert notes, "no record marks the gap"
    assert written == output["lines"] and counted == output["errors"] >= failed
    assert output["dropped"] == output["spooled"] == 0
    assert written + counted == produced
    # the findings about the first miners were produced and some never reached the file;
    # the later miners' were all written, after a note that names the gap
    assert len(_pid_records(records, lost_pids)) < 3 * len(lost_pids)
    first_kept = records.index(_pid_records(records, kept_pids)[0])
    assert any(_is_note(r) for r in records[:first_kept])
    (stop,) = [r for r in records if lifecycle("stop")(r)]
    assert stop["gpuguard"]["detail"]["log_errors"] == output["errors"]
    assert stop["gpuguard"]["detail"]["log_lost"] == output["errors"] + output["dropped"]
    assert f"not written {output['errors']}" in agent.stderr()  # the summary on stderr
