"""Scoring: weights to score and verdict, evidence order, allowlist, explain and JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuguard.correlate.state import ProcessKey, ProcessState
from gpuguard.detect.ruleset.load import load_ruleset
from gpuguard.detect.scoring.score import score_process
from gpuguard.events.process_facts import Ancestor, ProcessFacts

T = 1_700_000_000.0

RULES = """\
version: 1
thresholds: {suspicious: 40, malicious: 75}
actions: {clean: none, suspicious: alert, malicious: kill}
rules:
  - id: name-is-x
    description: name is x
    severity: high
    tags: [T1496]
    weight: 50
    condition: {signal: comm, is: x}
  - id: uid-root
    description: runs as root
    severity: low
    weight: 30
    condition: {signal: uid, is: 0}
  - id: deleted
    description: deleted executable
    severity: medium
    weight: 30
    condition: {signal: exe_deleted, is: true}
  - id: known-good
    description: signed vendor tool
    severity: info
    weight: -40
    condition: {signal: exe, glob: /opt/vendor/*}
allowlist:
  - id: trainer
    exe: /opt/train/*
  - id: pinned
    exe: /opt/pinned/tool
    sha256: "{SHA}"
  - id: in-pod
    exe: /usr/bin/worker
    container_id: "{CID}"
  - id: by-user
    user: svc-gpu
    parent_exe: /usr/sbin/slurmstepd
"""
CID = "ab" * 32


@pytest.fixture
def ruleset(tmp_path):
    path = tmp_path / "rules.yaml"
    path.write_text(RULES.replace("{SHA}", "a" * 64).replace("{CID}", CID))
    return load_ruleset([path])


def state(comm="x", exe="/usr/bin/x", **facts) -> ProcessState:
    s = ProcessState(ProcessKey(4242, T), first_seen=T, last_seen=T)
    s.set_facts(ProcessFacts(pid=4242, start_time=T, comm=comm, exe=exe, cmdline=[exe], **facts))
    return s


@pytest.mark.parametrize(
    "comm,uid,deleted,exe,score,verdict,action",
    [
        ("y", 1000, False, "/usr/bin/y", 0, "clean", "none"),
        ("y", 0, False, "/usr/bin/y", 30, "clean", "none"),
        ("x", 1000, False, "/usr/bin/x", 50, "suspicious", "alert"),
        ("x", 0, False, "/usr/bin/x", 80, "malicious", "kill"),
        ("x", 0, True, "/usr/bin/x", 100, "malicious", "kill"),  # 110 clamped to 100
        ("y", 1000, False, "/opt/vendor/tool", 0, "clean", "none"),  # -40 clamped to 0
        ("x", 0, False, "/opt/vendor/x", 40, "suspicious", "alert"),  # 50 + 30 - 40
    ],
)
def test_score_and_verdict(ruleset, comm, uid, deleted, exe, score, verdict, action):
    v = score_process(state(comm, exe, uid=uid, exe_deleted=deleted), ruleset, T)
    assert (v.score, v.verdict, v.action) == (score, verdict, action)
    assert sum(e.weight for e in v.evidence) == sum(
        r.weight for r in ruleset.rules if r.id in {e.rule_id for e in v.evidence}
    )


def test_evidence_order_and_fields(ruleset):
    v = score_process(state("x", uid=0, exe_deleted=True), ruleset, T)
    assert [e.rule_id for e in v.evidence] == [
        "name-is-x",
        "deleted",
        "uid-root",
    ]  # weight desc, then id
    e = v.evidence[0]
    assert (e.signal, e.detail, e.weight, e.severity, e.tags) == (
        "comm",
        "comm=x (is x)",
        50,
        "high",
        ("T1496",),
    )


def test_explain_is_one_escaped_line(ruleset):
    v = score_process(
        state("x", exe="/dev/shm/\x1b]0;evil\x07\nx", uid=0, exe_deleted=True), ruleset, T
    )
    line = v.explain()
    assert "\n" not in line and "\x1b" not in line and "\x07" not in line
    assert line == (
        "pid 4242 x (/dev/shm/\\x1b]0;evil\\x07\\nx, deleted) score 100 malicious: "
        "name is x (+50, name-is-x); deleted executable (+30, deleted); runs as root (+30, uid-root)"
    )


def test_explain_without_evidence(ruleset):
    assert (
        score_process(state("y", uid=1000), ruleset, T).explain()
        == "pid 4242 y (/usr/bin/x) score 0 clean: no evidence"
    )


def test_json_is_complete_and_deterministic(ruleset):
    one = score_process(state("x", uid=0), ruleset, T).to_json()
    two = score_process(state("x", uid=0), ruleset, T).to_json()
    assert json.dumps(one) == json.dumps(two)
    assert list(one) == [
        "pid",
        "start_time",
        "comm",
        "exe",
        "exe_deleted",
        "score",
        "score_capped",
        "score_cap",
        "verdict",
        "allowlisted",
        "allowlist_entry",
        "action",
        "time",
        "evidence",
    ]
    assert one["evidence"][0] == {
        "rule_id": "name-is-x",
        "description": "name is x",
        "signal": "comm",
        "detail": "comm=x (is x)",
        "weight": 50,
        "severity": "high",
        "tags": ["T1496"],
    }


def test_allowlisted_is_clean_but_keeps_evidence(ruleset):
    v = score_process(state("x", exe="/opt/train/bin/train", uid=0), ruleset, T)
    assert (v.verdict, v.allowlisted, v.allowlist_entry, v.score, v.action) == (
        "clean",
        True,
        "trainer",
        80,
        "none",
    )
    assert [e.rule_id for e in v.evidence] == ["name-is-x", "uid-root"]
    assert "clean (allowlisted by trainer)" in v.explain()


@pytest.mark.parametrize(
    "facts,allowlisted",
    [
        ({"exe": "/opt/train/bin/train"}, True),
        (
            {"exe": "/opt/train/bin/train", "exe_deleted": True},
            False,
        ),  # deleted binaries never match
        ({"exe": "/opt/train/bin/train", "container_id": CID}, False),  # host-only entry
        ({"exe": "/usr/bin/worker", "container_id": CID}, True),
        ({"exe": "/usr/bin/worker", "container_id": "cd" * 32}, False),
        ({"exe": "/usr/bin/worker"}, False),
        ({"exe": "/opt/pinned/tool"}, False),  # hash not computed (replay)
        (
            {
                "exe": "/usr/bin/x",
                "username": "svc-gpu",
                "ancestors": [Ancestor(5, "slurmstepd", "/usr/sbin/slurmstepd")],
            },
            True,
        ),
        (
            {
                "exe": "/usr/bin/x",
                "username": "svc-gpu",
                "ancestors": [Ancestor(5, "bash", "/usr/bin/bash")],
            },
            False,
        ),
        ({"exe": "/usr/bin/x", "username": "svc-gpu"}, False),
    ],
)
def test_allowlist_matching(ruleset, facts, allowlisted):
    exe = facts.pop("exe")
    assert score_process(state("x", exe=exe, uid=0, **facts), ruleset, T).allowlisted is allowlisted


def test_allowlist_sha256_from_live_exe(tmp_path, ruleset):
    import hashlib
    import os
    import subprocess
    import sys

    from gpuguard.correlate.correlator import Correlator
    from gpuguard.detect.scoring.engine import DetectionEngine
    from gpuguard.sources.proc.config_files import attach_config_files
    from gpuguard.sources.proc.process import collect_process_facts

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        facts = collect_process_facts(sleeper.pid)
        digest = hashlib.sha256(
            Path(os.readlink(f"/proc/{sleeper.pid}/exe")).read_bytes()
        ).hexdigest()
        rules = tmp_path / "r.yaml"
        rules.write_text(
            f"version: 1\nallowlist:\n  - id: py-wrong\n    exe: {facts.exe}\n    sha256: '{'0' * 64}'\n"
            f"  - id: py\n    exe: {facts.exe}\n    sha256: '{digest}'\n"
        )
        rs = load_ruleset([rules])
        correlator = Correlator(
            facts_provider=collect_process_facts, config_reader=attach_config_files
        )
        DetectionEngine(correlator, rs)
        correlator.feed(facts)
        st = correlator.state_of(sleeper.pid)
        assert st.exe_sha256 == digest
        v = score_process(st, rs, T)
        assert (v.allowlisted, v.allowlist_entry) == (True, "py")
    finally:
        sleeper.kill()
        sleeper.wait()


def test_same_state_same_verdict_across_rule_reloads(tmp_path, ruleset):
    s = state("x", uid=0)
    first = score_process(s, ruleset, T).to_json()
    path = tmp_path / "again.yaml"
    path.write_text(RULES.replace("{SHA}", "a" * 64).replace("{CID}", CID))
    assert score_process(s, load_ruleset([path]), T).to_json() == first


GENERIC_RULES = """\
version: 1
thresholds: {suspicious: 40, malicious: 75}
rules:
  - {id: busy, description: busy thread, severity: low, tags: [cpu, generic], weight: 20,
     condition: {signal: uid, is: 1000}}
  - {id: port, description: port a cache shares, severity: low, tags: [generic], weight: 15,
     condition: {signal: comm, is: worker}}
  - {id: quiet, description: quiet session, severity: low, tags: [generic], weight: 10,
     condition: {signal: exe, glob: /usr/*}}
  - {id: odd-parent, description: a generic fact of weight 30, severity: low, tags: [generic],
     weight: 30, condition: {signal: exe, glob: /usr/local/*}}
  - {id: vendor, description: signed vendor tool, severity: info, weight: -5,
     condition: {signal: exe, glob: /usr/local/vendor/*}}
  - {id: pool-protocol, description: pool protocol, severity: critical, tags: [T1496], weight: 5,
     condition: {signal: uid, is: 1000}}
"""


@pytest.fixture
def generic_ruleset(tmp_path):
    path = tmp_path / "generic.yaml"
    path.write_text(GENERIC_RULES)
    return load_ruleset([path])


def test_three_generic_facts_alone_are_capped_below_suspicious(generic_ruleset):
    """busy (20) + port (15) + quiet (10) = 45 with nothing specific: held at 39, clean, and the
    verdict says so.  This fails if generic facts alone can reach suspicious again."""
    without_specific = [r for r in generic_ruleset.rules if r.id != "pool-protocol"]
    generic_ruleset.rules[:] = without_specific
    v = score_process(state("worker", "/usr/bin/worker", uid=1000), generic_ruleset, T)
    assert [e.rule_id for e in v.evidence] == ["busy", "port", "quiet"]
    assert (v.score, v.verdict, v.action) == (39, "clean", "none")
    assert v.cap is not None and (v.cap.uncapped, v.cap.limit) == (45, 39)
    assert "busy, port, quiet" in v.cap.reason
    doc = v.to_json()
    assert doc["score_capped"] is True and doc["score_cap"]["uncapped_score"] == 45
    assert "score 39 (capped from 45: generic evidence only) clean" in v.explain()
    # four generic facts (75 uncapped, the malicious threshold) are held there too
    v = score_process(state("worker", "/usr/local/worker", uid=1000), generic_ruleset, T)
    assert (v.score, v.verdict, v.cap.uncapped) == (39, "clean", 75)
    # benign evidence (a negative weight) is no specific fact: still capped
    v = score_process(state("worker", "/usr/local/vendor/w", uid=1000), generic_ruleset, T)
    assert "vendor" in {e.rule_id for e in v.evidence} and (v.score, v.cap.uncapped) == (39, 70)


def test_one_specific_fact_lifts_the_cap(generic_ruleset):
    v = score_process(state("worker", "/usr/bin/worker", uid=1000), generic_ruleset, T)
    assert "pool-protocol" in {e.rule_id for e in v.evidence}
    assert (v.score, v.verdict, v.cap) == (50, "suspicious", None)
    assert v.to_json()["score_capped"] is False and v.to_json()["score_cap"] is None
    assert "capped" not in v.explain()


def test_a_score_below_the_threshold_is_not_capped(generic_ruleset):
    v = score_process(state("worker", "/opt/worker", uid=0), generic_ruleset, T)
    assert (v.score, v.cap) == (15, None)
