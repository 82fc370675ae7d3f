"""A reload re-judges the living, never the dead (the real agent, eBPF sensor, real processes).

Five short miner-shaped workloads (malicious from their command line, 2.5 s each) end
before the reloads; one long-lived workload (suspicious: a miner flag from /tmp)
lives through them.  Four reloads follow, alternating SIGHUP and the rule-file watch: the
second adds a rule that makes the living one malicious, the fourth only rewords that rule.
The ended processes must get no record and no action from any reload; the living one gets
exactly one update (the escalation) and is acted on once for it.  Monitor mode and enforce
mode (dry run, scoped to a cgroup this test made) alike.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from gpuguard.proving.enforce_scope import EnforceScope
from tests.support.agent_run import AgentProcess, until
from tests.support.cgroup_start import in_cgroup
from tests.support.workloads import build_workload

pytestmark = [pytest.mark.root, pytest.mark.self_contained]

WALLET = "4" + "8" * 94  # Monero-shaped; no one's wallet
SHORT_MINERS = 5
SHIPPED_RULES = Path(__file__).resolve().parent.parent / "rules" / "miner-rules.yaml"
EXTRA_RULE = """\
version: 1
rules:
  - id: gg-reload-test
    description: {description}
    severity: high
    weight: {weight}
    condition: {{signal: cmdline, contains: {marker}}}
"""


def _rules(path: Path, marker: str, weight: int, description: str) -> None:
    """Write the test's own rule file (a change the agent's rule-file watch notices)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(EXTRA_RULE.format(marker=marker, weight=weight, description=description))
    tmp.chmod(0o600)
    tmp.rename(path)  # a new inode: seen by the watch even within one mtime tick


def _spawn(argv: list[str], cgroup: Path | None) -> subprocess.Popen:
    return subprocess.Popen(
        in_cgroup(argv, cgroup), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL
    )


def _by_pid(agent: AgentProcess) -> tuple[dict[int, list], dict[int, list]]:
    """Finding records and action records per pid, in log order."""
    findings: dict[int, list] = collections.defaultdict(list)
    actions: dict[int, list] = collections.defaultdict(list)
    for record in agent.records():
        kind = record.get("gpuguard", {}).get("kind")
        pid = record.get("process", {}).get("pid")
        if kind == "process" and "finding" in record["gpuguard"]:
            findings[pid].append(record)
        elif kind == "action":
            actions[pid].append(record)
    return findings, actions


def _closed(agent: AgentProcess, pids: list[int], timeout: float = 30.0) -> None:
    """Wait until each of ``pids`` (ended) has its finding closed; else fail saying what each had."""
    try:
        until(
            lambda: all(
                any(r["gpuguard"]["finding"]["activity"] == "close" for r in _by_pid(agent)[0][p])
                for p in pids
            ),
            timeout=timeout,
        )
    except AssertionError:
        found = _by_pid(agent)[0]
        had = {p: [r["gpuguard"]["finding"]["activity"] for r in found[p]] for p in pids}
        counters = agent.status().get("counters", {})
        raise AssertionError(
            f"ended miners without a closed finding: {had}; exec filter "
            f"{counters.get('execs')}; ring lost {counters.get('ring_lost')}"
        ) from None


def _settled(agent: AgentProcess, pids: list[int], quiet_s: float = 2.0) -> None:
    """Wait until no record about ``pids`` has been added for ``quiet_s`` (the responder's
    outcomes, the closes due at the next poll and a reload's rescoring all had their turn).
    Records about other processes are left out: on a busy host they may never stop."""

    def ours() -> int:
        return sum(len(found.get(pid, ())) for found in _by_pid(agent) for pid in pids)

    last, since, deadline = -1, time.monotonic(), time.monotonic() + 60
    while time.monotonic() < deadline:
        count = ours()
        if count != last:
            last, since = count, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return
        time.sleep(0.2)
    raise AssertionError(f"the records about {pids} never settled ({last} so far)")


def _reloads(agent: AgentProcess) -> int:
    return sum(
        1
        for r in agent.records()
        if r.get("gpuguard", {}).get("kind") == "lifecycle"
        and r["event"]["action"] == "reload"
        and r["message"].startswith("rules reloaded")
    )


@pytest.mark.parametrize("mode", ["monitor", "enforce"])
def test_reloads_neither_replay_ended_findings_nor_act_on_them_again(tmp_path, mode):
    os.chmod(tmp_path, 0o700)
    marker = f"gg-living-{os.getpid()}-{mode}"
    extra = tmp_path / "extra-rules.yaml"
    _rules(extra, "gg-matches-nothing", 10, "a rule no process matches")
    with EnforceScope(tmp_path) as scope:
        config = tmp_path / "agent.yaml"
        text = f"sensor: ebpf\nrules: [{SHIPPED_RULES}, {extra}]\n"
        if mode == "enforce":
            text += "mode: enforce\ndry_run: true\n" + scope.response_section()
        config.write_text(text)
        config.chmod(0o600)
        cgroup = scope.cgroup if mode == "enforce" else None
        agent = AgentProcess(tmp_path, "--config", str(config))
        workload = str(build_workload())
        living = None
        try:
            agent.wait_ready()
            living = _spawn(
                [workload, "sleep:600000", "exit:0", "--coin", "monero", marker], cgroup
            )
            # each lives past the exec filter's age (0.5 s) with time to spare for a loaded
            # host's /proc read: a plain exec is read only once it lives (docs/agent.md)
            miners = [
                _spawn(
                    [workload, "sleep:2500", "exit:0"]
                    + ["-o", "stratum+tcp://127.0.0.1:3333", "-u", WALLET, "--donate-level", "1"],
                    cgroup,
                )
                for _ in range(SHORT_MINERS)
            ]
            ended = [m.pid for m in miners]
            for miner in miners:
                assert miner.wait(timeout=20) == 0
            _closed(agent, ended)
            _settled(agent, [living.pid, *ended])
            before, acted_before = _by_pid(agent)
            (create,) = before[living.pid]
            assert create["gpuguard"]["verdict"] == "suspicious", create["gpuguard"]
            for pid in ended:
                assert [r["gpuguard"]["finding"]["activity"] for r in before[pid]] == [
                    "create",
                    "close",
                ], before[pid]
                assert acted_before[pid], f"no action record for the malicious pid {pid}"
            # the reloads, alternating SIGHUP and the rule-file watch, within the correlator's
            # 30 s hold on ended processes with a finding
            steps = [
                lambda: agent.signal(signal.SIGHUP),
                lambda: _rules(extra, marker, 60, "the living workload's marker"),
                lambda: agent.signal(signal.SIGHUP),
                lambda: _rules(extra, marker, 60, "the living workload's marker, reworded"),
            ]
            escalated_actions = None
            for number, step in enumerate(steps, 1):
                step()
                until(lambda n=number: _reloads(agent) >= n, timeout=15)
                _settled(agent, [living.pid, *ended])
                if number == 2:
                    escalated_actions = len(_by_pid(agent)[1][living.pid])
            living_records, living_actions = (found[living.pid] for found in _by_pid(agent))
        finally:
            if living is not None:
                living.kill()
                living.wait(timeout=10)
            assert agent.stop() == 0, agent.stderr()
    after, acted_after = _by_pid(agent)
    for pid in ended:
        assert [r["event"]["id"] for r in after[pid]] == [r["event"]["id"] for r in before[pid]], (
            f"pid {pid}: a reload wrote records for an ended process: "
            f"{len(before[pid])} before the reloads, {len(after[pid])} after"
        )
        assert len(acted_after[pid]) == len(acted_before[pid]), (
            f"pid {pid}: a reload acted on an ended process again: "
            f"{len(acted_before[pid])} actions before the reloads, {len(acted_after[pid])} after"
        )
    records = living_records  # before it was ended (its close follows)
    assert [r["gpuguard"]["finding"]["activity"] for r in records] == ["create", "update"], [
        (r["gpuguard"]["finding"], r["gpuguard"]["verdict"]) for r in records
    ]
    escalation = records[1]
    assert escalation["gpuguard"]["verdict"] == "malicious"
    assert escalation["gpuguard"]["finding"]["changes"][0] == "escalation"
    assert "gg-reload-test" in escalation["gpuguard"]["rule_ids"]
    # acted on for the create and once for the escalation; the later reloads added nothing
    assert len(acted_before[living.pid]) >= 1
    assert escalated_actions is not None and escalated_actions > len(acted_before[living.pid])
    assert len(living_actions) == escalated_actions
    if mode == "enforce":  # planned, not done: a dry run (an alert is only a log line)
        planned = [
            a
            for p in (living.pid, *ended)
            for a in acted_after[p]
            if a["event"]["action"] != "alert"
        ]
        statuses = {a["gpuguard"]["status"] for a in planned}  # a gone process: not planned
        assert "dry-run" in statuses and "done" not in statuses, [
            (a["event"]["action"], a["gpuguard"]["status"], a["gpuguard"]["reason"])
            for a in planned
        ]
    ids = [r["event"]["id"] for rs in after.values() for r in rs]
    assert len(ids) == len(set(ids)), "an event.id was written twice"
