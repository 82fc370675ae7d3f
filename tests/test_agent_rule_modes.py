"""Enforce, rule by rule, in a real agent: a monitor-mode rule says what it would do and touches
nothing; a reload that moves a rule to enforce makes its next match act, once.

Each agent acts only inside a cgroup made for the test (:class:`EnforceScope`); the test's
processes are started there, and one started outside proves the scope holds.  The rules are a
test file whose rules match a marker word only the test's own processes carry.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuguard.proving.enforce_scope import EnforceScope
from tests.support.agent_run import AgentProcess, actions_on, finding_for
from tests.support.cgroup_start import in_cgroup

pytestmark = [pytest.mark.root, pytest.mark.self_contained]

RULES = """\
version: 1
actions: {{malicious: kill}}
rules:
  - id: test-enforced
    description: carries the enforced marker
    severity: high
    weight: 80
    condition: {{signal: cmdline, contains: {enforced}}}
  - id: test-monitored
    description: carries the monitored marker
    severity: high
    weight: 80
    condition: {{signal: cmdline, contains: {monitored}}}
"""


def _config(tmp_path: Path, scope: EnforceScope, act_rules: list[str]) -> Path:
    os.chmod(tmp_path, 0o700)
    rules = tmp_path / "test-rules.yaml"
    marker = f"gg{os.getpid()}"
    rules.write_text(RULES.format(enforced=f"{marker}-enforced", monitored=f"{marker}-monitored"))
    rules.chmod(0o600)
    config = tmp_path / "agent.yaml"
    config.write_text(
        "mode: enforce\nsensor: ebpf\nrules: [test-rules.yaml]\n"
        + scope.response_section()
        + "  actions: {malicious: [kill], suspicious: alert}\n"
        + f"  act_rules: {json.dumps(act_rules)}\n"
    )
    config.chmod(0o600)
    return config


def _start(kind: str, cgroup: Path | None) -> subprocess.Popen:
    """A python sleeper whose command line carries the marker of ``kind`` (inside ``cgroup``)."""
    argv = [sys.executable, "-c", "import time; time.sleep(600)", f"gg{os.getpid()}-{kind}"]
    return subprocess.Popen(in_cgroup(argv, cgroup), stdin=subprocess.DEVNULL)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)


def _gone(proc: subprocess.Popen, timeout: float = 10) -> bool:
    try:
        proc.wait(timeout=timeout)
        return True
    except subprocess.TimeoutExpired:
        return False


def _done(pid: int, action: str):
    return lambda r: (
        r.get("gpuguard", {}).get("kind") == "action"
        and r["gpuguard"].get("action") == action
        and r["gpuguard"].get("status") == "done"
        and r.get("process", {}).get("pid") == pid
    )


def _rule_row(status: dict, rule: str) -> dict:
    return next((r for r in status.get("rules_acting", []) if r["rule"] == rule), {})


def test_a_monitor_mode_rule_touches_nothing_and_says_what_enforce_would_do(tmp_path):
    with EnforceScope(tmp_path) as scope:
        agent = AgentProcess(tmp_path, "--config", str(_config(tmp_path, scope, ["test-enforced"])))
        procs = []
        try:
            agent.wait_ready()
            held = _start("monitored", scope.cgroup)
            outside = _start("enforced", None)  # an enforce-mode rule, outside the scope
            acted = _start("enforced", scope.cgroup)
            procs = [held, outside, acted]
            found = agent.wait_record(finding_for(held.pid), timeout=30)
            assert found["gpuguard"]["verdict"] == "malicious"
            assert found["gpuguard"]["response"] == {
                "would_act": ["kill"],
                "acts": [],
                "rules": {"test-monitored": "monitor: not in response.act_rules"},
                "why_not": "no matched rule is in enforce mode "
                "(test-monitored: not in response.act_rules)",
            }
            # the enforce-mode rule acts on its process in the scope: the control
            agent.wait_record(_done(acted.pid, "kill"), timeout=30)
            assert _gone(acted), "the enforce-mode rule's process survived"
            refused = agent.wait_record(
                lambda r: actions_on([r], outside.pid) and r["gpuguard"]["status"] == "refused",
                timeout=30,
            )
            assert "outside the response scope" in json.dumps(refused)
            status = agent.wait_status(
                lambda d: _rule_row(d, "test-enforced").get("acted"), timeout=20
            )
            held_row = _rule_row(status, "test-monitored")
            assert held_row["would_act"] == {"kill": 1} and held_row["acted"] == {}
            assert held_row["processes"][0].endswith(f"({held.pid})")
            enforced_row = _rule_row(status, "test-enforced")
            assert enforced_row["acted"] == {"kill": 1}
            assert enforced_row["would_act"] == {"kill": 1}  # the refused one, outside the scope
            time.sleep(3)  # a few more scoring passes: still untouched
            assert held.poll() is None and outside.poll() is None
            assert not [
                r
                for r in actions_on(agent.records(), held.pid)
                if r["gpuguard"]["action"] == "kill"
            ]
            monitor_alert = [
                r
                for r in actions_on(agent.records(), held.pid)
                if r["gpuguard"]["action"] == "alert"
            ]
            assert monitor_alert and "enforce mode would: kill" in monitor_alert[0]["message"]
        finally:
            for proc in procs:
                _stop(proc)
            assert agent.stop() == 0, agent.stderr()


def test_a_reload_that_moves_a_rule_to_enforce_makes_the_next_match_act_once(tmp_path):
    with EnforceScope(tmp_path) as scope:
        config = _config(tmp_path, scope, ["test-enforced"])
        agent = AgentProcess(tmp_path, "--config", str(config))
        procs = []
        try:
            agent.wait_ready()
            before = _start("monitored", scope.cgroup)
            procs.append(before)
            agent.wait_record(finding_for(before.pid), timeout=30)
            _config(tmp_path, scope, ["test-enforced", "test-monitored"])
            agent.signal(signal.SIGHUP)
            agent.wait_record(
                lambda r: (
                    r.get("gpuguard", {}).get("kind") == "lifecycle"
                    and r["event"]["action"] == "reload"
                ),
                timeout=30,
            )
            after = _start("monitored", scope.cgroup)
            procs.append(after)
            agent.wait_record(_done(after.pid, "kill"), timeout=30)
            assert _gone(after), "the rule moved to enforce did not act"
            time.sleep(3)  # more passes: one kill, and the match before the reload untouched
            kills = [
                r
                for r in actions_on(agent.records(), after.pid)
                if r["gpuguard"]["action"] == "kill"
            ]
            assert len(kills) == 1, kills
            assert before.poll() is None
            assert not [
                r
                for r in actions_on(agent.records(), before.pid)
                if r["gpuguard"]["action"] == "kill"
            ]
            row = _rule_row(agent.status(), "test-monitored")
            assert row["would_act"] == {"kill": 1} and row["acted"] == {"kill": 1}
        finally:
            for proc in procs:
                _stop(proc)
            assert agent.stop() == 0, agent.stderr()
