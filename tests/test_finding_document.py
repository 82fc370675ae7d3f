"""One finding shape: its category is a field of the rule, and hooks and the state file render it."""

from __future__ import annotations

from dataclasses import fields

from gpuguard.correlate.state import ProcessKey, ProcessState
from gpuguard.detect.ruleset.load import load_ruleset
from gpuguard.detect.scoring.score import score_process
from gpuguard.events.process_facts import ProcessFacts
from gpuguard.outputs.finding import Finding, finding_from_verdict
from gpuguard.outputs.finding_document import finding_document, status_row

T = 1_700_000_000.0
RULES = """\
version: 1
rules:
  - id: site-pool
    description: connected to the lab pool
    severity: high
    weight: 30
    tags: [network]
    condition: {signal: connect_ports, contains: 3333}
  - id: net-named-only
    description: named like a network rule, tagged as none
    severity: high
    weight: 30
    condition: {signal: comm, is: xmrig}
"""


def scored(tmp_path, comm: str, port: int):
    path = tmp_path / "rules.yaml"
    path.write_text(RULES)
    ruleset = load_ruleset([path])
    state = ProcessState(ProcessKey(7, T), first_seen=T, last_seen=T)
    state.set_facts(ProcessFacts(pid=7, start_time=T, comm=comm, exe=f"/usr/bin/{comm}"))
    state.add_connection("127.0.0.1", port)
    verdict = score_process(state, ruleset, T + 1)
    return finding_from_verdict(verdict, state.facts, ruleset, state)


def test_the_category_comes_from_the_rule_not_its_id(tmp_path):
    by_tag = scored(tmp_path, "worker", 3333)
    assert by_tag.rule_ids == ["site-pool"]
    assert by_tag.categories == ["process", "intrusion_detection", "network"]
    by_name = scored(tmp_path, "xmrig", 443)
    assert by_name.rule_ids == ["net-named-only"]
    assert by_name.categories == ["process", "intrusion_detection"]


def test_the_plain_document_carries_every_field_of_the_finding(tmp_path):
    finding = scored(tmp_path, "xmrig", 3333)
    finding.finding_id, finding.sequence = "gpuguard-" + "a" * 31, 2
    doc = finding_document(finding)
    missing = {f.name for f in fields(Finding)} - set(doc)
    assert missing == {"evidence_omitted"}  # a log record's bound, not part of the finding
    assert doc["record_id"] == finding.finding_id + "-2"
    assert doc["process"]["executable"] == "/usr/bin/xmrig" and doc["categories"][-1] == "network"
    assert [e["rule_id"] for e in doc["evidence"]] == ["net-named-only", "site-pool"]


def test_the_state_file_row_is_rendered_from_the_finding(tmp_path):
    finding = scored(tmp_path, "x\x1b[2Jmr", 3333)
    row = status_row(finding, T + 2)
    assert row == {
        "time": T + 2,
        "pid": 7,
        "start_time": T,
        "comm": "x\\x1b[2Jmr",
        "verdict": finding.verdict,
        "score": 30,
        "rule_ids": ["site-pool"],
        "allowlisted": False,
    }


def test_guard_policy_findings_have_their_own_id_and_numbered_records():
    from gpuguard.agent.stages.s5_report.findings import ProcessFindings, finding_id

    tracker = ProcessFindings(hostname="node-1")
    key = ProcessKey(7, T)
    first = tracker.stamp_guard(
        Finding("process", "guard.x", "guard.x", "", 50, "suspicious", ""), key
    )
    again = tracker.stamp_guard(
        Finding("process", "guard.x", "guard.x", "", 80, "malicious", ""), key
    )
    assert first.finding_id == again.finding_id != finding_id("node-1", 7, T)
    assert (first.record_id, again.record_id) == (f"{first.finding_id}-0", f"{first.finding_id}-1")
