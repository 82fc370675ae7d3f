"""Rule maturity tiers and operator content: validated with positions, counted from the agent's
tier, listed, and rendered into the generated rules reference."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from gpuguard.agent.config import load_config
from gpuguard.config.reference import doc_block, in_doc
from gpuguard.correlate.state import ProcessKey, ProcessState
from gpuguard.detect.ruleset.load import MATURITIES, load_ruleset, validate_rules
from gpuguard.detect.ruleset.reference import MARKERS, rules_reference
from gpuguard.detect.ruleset.shipped import shipped_rules_file
from gpuguard.detect.scoring.score import score_process
from gpuguard.errors import GpuguardError
from gpuguard.events.process_facts import ProcessFacts
from gpuguard.outputs.records import FORMATS

REPO = Path(__file__).resolve().parent.parent
T = 1_700_000_000.0

SITE = """\
version: 1
rules:
  - id: site-stable
    description: runs sleep
    severity: low
    weight: 20
    condition: {signal: exe_name, is: sleep}
  - id: site-incubating
    description: runs sleep, incubating
    severity: low
    weight: 30
    condition: {signal: exe_name, is: sleep}
    maturity: incubating
  - id: site-experimental
    description: runs sleep, experimental
    severity: low
    weight: 40
    condition: {signal: exe_name, is: sleep}
    maturity: experimental
    false_positives: [the sleep in every shell script]
    references: [T1496, "https://example.org/sleep", {attack: T1036, title: Masquerading}]
    runbook: |
      ls -l /proc/PID/exe
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    path.chmod(0o644)
    return path


def sleeper() -> ProcessState:
    state = ProcessState(ProcessKey(4242, T), first_seen=T, last_seen=T)
    state.set_facts(
        ProcessFacts(pid=4242, start_time=T, ppid=1, comm="sleep", exe="/usr/bin/sleep", uid=1000)
    )
    return state


def test_every_shipped_rule_names_its_tier_and_its_content():
    rules = yaml.safe_load(shipped_rules_file().read_text())["rules"]
    for rule in rules:
        assert rule.get("maturity") in MATURITIES, rule["id"]
        assert rule["false_positives"] and rule["runbook"].strip(), rule["id"]
        assert any(str(r).startswith("T") for r in rule["references"]), rule["id"]  # ATT&CK
    compiled = load_ruleset([shipped_rules_file()])
    for rule in compiled.rules + compiled.disabled:
        commands = [line for line in rule.content.runbook.splitlines() if line[:1] not in "#"]
        assert commands, rule.id  # commands to run on the node
    tiers = {r["id"]: r["maturity"] for r in rules}
    assert tiers["cpu-fpu-rounding-switching"] == "experimental"  # weight 0: recorded only
    assert tiers["miner-cmdline-stratum"] == "stable"


def test_the_counting_tier_decides_which_rules_reach_the_verdict(tmp_path):
    site = write(tmp_path, "site.yaml", SITE)
    every = score_process(sleeper(), load_ruleset([site]), T + 1)
    assert every.score == 90 and every.verdict == "malicious"
    stable_set = load_ruleset([site], "stable")
    assert [r.id for r in stable_set.rules] == ["site-stable"]
    assert [r.id for r in stable_set.disabled] == ["site-incubating", "site-experimental"]
    stable = score_process(sleeper(), stable_set, T + 1)
    assert (stable.score, stable.verdict) == (20, "clean")
    assert [e.rule_id for e in stable.evidence] == ["site-stable"]
    incubating = score_process(sleeper(), load_ruleset([site], "incubating"), T + 1)
    assert incubating.score == 50 and incubating.verdict == "suspicious"


def test_content_is_compiled_onto_the_rule(tmp_path):
    rule = load_ruleset([write(tmp_path, "site.yaml", SITE)]).rule("site-experimental")
    assert rule.maturity == "experimental"
    assert rule.content.false_positives == ("the sleep in every shell script",)
    assert rule.content.techniques == ("T1496", "T1036")
    assert [r.link for r in rule.content.references] == [
        "https://attack.mitre.org/techniques/T1496/",
        "https://example.org/sleep",
        "https://attack.mitre.org/techniques/T1036/",
    ]
    assert rule.content.runbook == "ls -l /proc/PID/exe"


def test_bad_tiers_and_content_are_problems_at_their_position(tmp_path):
    bad = SITE.replace("maturity: incubating", "maturity: beta").replace(
        "{attack: T1036, title: Masquerading}", "{attack: T1036, titel: Masquerading}"
    )
    bad += "    colour: red\n"
    path = write(tmp_path, "bad.yaml", bad)
    problems = [str(p) for p in validate_rules([path])]
    assert any(
        ":13:15: rule site-incubating: maturity 'beta' must be one of stable, incubating, "
        "experimental" in p
        for p in problems
    ), problems
    assert any("unknown reference key 'titel'" in p and ":21:17:" in p for p in problems), problems
    assert any(":24:5: rule site-experimental: unknown rule key 'colour'" in p for p in problems)
    # the command: one line a problem, never a traceback
    run = subprocess.run(
        [sys.executable, "-m", "gpuguard", "rules", "validate", str(path)],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2 and "Traceback" not in run.stdout + run.stderr
    assert f"{path}:13:15: rule site-incubating: maturity 'beta'" in run.stdout


def test_an_override_moves_a_shipped_rule_between_tiers(tmp_path):
    site = write(
        tmp_path,
        "site.yaml",
        "version: 1\nrules:\n  - id: gpu-night-only\n    override: {maturity: stable}\n"
        "  - id: miner-cmdline-flags\n    override: {maturity: experimental}\n",
    )
    ruleset = load_ruleset([shipped_rules_file(), site], "stable")
    assert ruleset.rule("gpu-night-only") in ruleset.rules
    assert ruleset.rule("miner-cmdline-flags") in ruleset.disabled


def test_rules_list_shows_tiers_and_what_does_not_count():
    run = subprocess.run(
        [sys.executable, "-m", "gpuguard", "rules", "list", "--maturity", "stable"],
        capture_output=True,
        text=True,
        check=True,
    )
    lines = {line.split()[0]: line for line in run.stdout.splitlines()}
    assert " stable " in lines["miner-cmdline-stratum"]
    assert "not counted" not in lines["miner-cmdline-stratum"]
    assert " incubating " in lines["gpu-night-only"]
    assert "(not counted: below stable)" in lines["gpu-night-only"]


def test_the_agent_setting_is_checked_with_its_position(tmp_path):
    config = write(tmp_path, "agent.yaml", "mode: monitor\nmaturity: beta\n")
    try:
        load_config(config)
    except GpuguardError as exc:
        line = exc.one_line()
        assert f"{config}:2:11" in line and "stable" in line, line
    else:
        raise AssertionError("maturity: beta was accepted")
    assert (
        load_config(write(tmp_path, "ok.yaml", "maturity: incubating\n")).maturity == "incubating"
    )


def test_the_rules_reference_is_generated_from_the_shipped_rules():
    doc = REPO / "docs" / "rules-reference.md"
    expected = doc_block(rules_reference(load_ruleset([shipped_rules_file()])), MARKERS, fence="")
    assert in_doc(doc, MARKERS) == expected, (
        "docs/rules-reference.md differs from the shipped rules "
        "(fix: .venv/bin/python -m gpuguard rules reference --update docs/rules-reference.md)"
    )


def _miner_finding(**k8s):
    """The shipped rules' finding on a miner in a pod, with what enforce would do."""
    from gpuguard.outputs.finding import finding_from_verdict

    ruleset = load_ruleset([shipped_rules_file()])
    state = ProcessState(ProcessKey(4242, T), first_seen=T, last_seen=T)
    argv = ["./xmrig", "-o", "stratum+tcp://pool.supportxmr.com:3333", "--donate-level=1"]
    state.set_facts(
        ProcessFacts(
            pid=4242,
            start_time=T,
            comm="xmrig",
            exe="/tmp/.x/xmrig",
            cmdline=argv,
            container_id="c" * 64,
            pod_uid="0f4c5e0a-1b2c-4d3e-8f9a-0123456789ab",
            **k8s,
        )
    )
    verdict = score_process(state, ruleset, T + 1)
    finding = finding_from_verdict(verdict, state.facts, ruleset, state)
    finding.finding_id = "gpuguard-" + "b" * 31
    finding.response = {
        "would_act": ["kill"],
        "acts": [],
        "rules": {e.rule_id: "monitor: not in response.act_rules" for e in verdict.evidence},
        "why_not": "no matched rule is in enforce mode",
    }
    finding.process.kubernetes_unknown = ["image"] if "container_image" not in k8s else []
    return finding


def test_records_carry_the_rule_content_the_response_and_the_pod_schema_valid_within_8_kib():
    from tests.support.records import render_record
    from tests.support.schemas import record_errors

    finding = _miner_finding(
        pod_namespace="team-b", pod_name="job-7", container_name="main", container_image="r.ex/b:3"
    )
    top = finding.rule_id
    rule = load_ruleset([shipped_rules_file()]).rule(top)
    host = {"hostname": "gpu-node-7", "name": "gpu-node-7"}
    for fmt in FORMATS:
        line = render_record(finding, fmt, host)
        assert not record_errors(line), (fmt, record_errors(line))
        assert len(line.encode()) <= 8192, (fmt, len(line.encode()))
    ecs = yaml.safe_load(render_record(finding, "ecs", host))
    assert ecs["rule"]["id"] == top and ecs["rule"]["reference"].startswith("https://")
    assert ecs["gpuguard"]["rule"]["maturity"] == "stable"
    assert ecs["gpuguard"]["rule"]["false_positives"] == list(rule.content.false_positives)
    assert ecs["gpuguard"]["rule"]["runbook"] == rule.content.runbook
    assert ecs["gpuguard"]["response"]["would_act"] == ["kill"]
    assert ecs["container"]["image"]["name"] == "r.ex/b:3"
    assert ecs["orchestrator"]["namespace"] == "team-b"
    ocsf = yaml.safe_load(render_record(finding, "ocsf", host))
    assert ocsf["finding_info"]["analytic"]["category"] == "stable"
    assert ocsf["remediation"]["desc"] == rule.content.runbook
    assert ocsf["remediation"]["references"] == [r.link for r in rule.content.references]
    assert ocsf["unmapped"]["gpuguard"]["response"]["acts"] == []
    cef = render_record(finding, "cef", host)
    assert "flexString2Label=rule flexString2=" in cef and '"maturity":"stable"' in cef


def test_a_pod_the_node_cannot_name_says_so_in_the_record():
    from tests.support.records import render_record

    finding = _miner_finding(pod_namespace="team-b", pod_name="job-7", container_name="main")
    ecs = yaml.safe_load(
        render_record(finding, "ecs", {"hostname": "gpu-node-7", "name": "gpu-node-7"})
    )
    assert ecs["gpuguard"]["kubernetes_unknown"] == ["image"]
    assert "image" not in ecs["container"]
