"""Every log record conforms to the schema it declares: OCSF (validated), ECS (field list), CEF (strict parser)."""

from __future__ import annotations

import json

import pytest

import gpuguard.detect.host.gpu_checks  # noqa: F401 - registers the GPU host rules
from gpuguard.detect.host.checks import HostFinding, apply_thresholds
from gpuguard.detect.host.rules import HOST_RULES
from gpuguard.detect.ruleset.model import Thresholds
from gpuguard.escape import visible_text
from gpuguard.events.agent_events import (
    LIFECYCLE_ACTIONS,
    ActionOutcome,
    AgentLifecycle,
)
from gpuguard.outputs.bounds import OutputLimits
from gpuguard.outputs.ecs import _ACTION_ECS_TYPE, EXPECTED_EVENT_TYPES
from gpuguard.outputs.finding import Finding, finding_from_host
from gpuguard.outputs.ocsf import OCSF_VERSION
from gpuguard.outputs.records import FORMATS
from gpuguard.outputs.scan_report import scan_document
from tests.support.findings import (
    HOST,
    HOSTILE,
    capped_finding,
    hostile_finding,
    lifecycle_findings,
    record_corpus,
    scan_report,
)
from tests.support.records import render_record
from tests.support.schemas import ecs_errors, ecs_fields, ecs_pair_errors, ocsf_errors, strict_cef


@pytest.fixture(scope="module")
def corpus(miner_finding):
    return record_corpus(miner_finding)


# -- OCSF -------------------------------------------------------------------------------------


def test_the_validator_catches_what_the_siem_engineer_found():
    finding = json.loads(render_record(hostile_finding(), "ocsf", HOST))
    assert ocsf_errors(finding) == []
    finding["is_alert"] = True  # an OCSF 1.4 attribute
    assert any("is_alert" in e for e in ocsf_errors(finding))
    action = json.loads(
        render_record(ActionOutcome(time=1.0, action="hook", status="done", pid=5), "ocsf")
    )
    assert action["class_uid"] == 7001 and ocsf_errors(action) == []
    action["process"] = {"pid": 5}
    del action["command_uid"]
    assert len(ocsf_errors(action)) == 2


def test_every_ocsf_record_validates(corpus):
    classes = set()
    for record in corpus:
        event = json.loads(render_record(record, "ocsf", HOST))
        classes.add(event["class_uid"])
        assert ocsf_errors(event) == [], (type(record).__name__, event.get("type_name"))
    assert classes == {2004, 7001, 7003, 7004, 6002}


@pytest.mark.parametrize("budget", [1024, 2048, 4096])
def test_records_shed_to_fit_a_small_budget_still_validate(corpus, budget):
    limits = OutputLimits(record=budget)
    for record in corpus:
        ocsf = render_record(record, "ocsf", HOST, limits)
        ecs = render_record(record, "ecs", HOST, limits)
        assert len(ocsf.encode()) <= budget and len(ecs.encode()) <= budget
        assert ocsf_errors(json.loads(ocsf)) == [], type(record).__name__
        assert ecs_errors(json.loads(ecs)) == [], type(record).__name__
        strict_cef(render_record(record, "cef", HOST, limits))


def test_remediation_activity_has_a_command_uid_and_no_process():
    kill, hook = (
        json.loads(render_record(ActionOutcome(time=1.0, action=a, status="done", pid=5), "ocsf"))
        for a in ("kill", "hook")
    )
    assert kill["class_uid"] == 7003 and kill["process"]["pid"] == 5 and kill["command_uid"]
    assert hook["class_uid"] == 7001 and "process" not in hook and hook["command_uid"]
    assert hook["unmapped"]["gpuguard"]["process"]["pid"] == 5


def test_scan_ocsf_documents_validate(corpus):
    findings = [r for r in corpus if isinstance(r, Finding)]
    document = scan_document(scan_report(findings), "ocsf")
    assert document["scanner"]["schema"]["version"] == OCSF_VERSION
    for event in document["findings"]:
        assert ocsf_errors(json.loads(json.dumps(event, default=str))) == []


# -- ECS --------------------------------------------------------------------------------------


def test_the_ecs_check_can_fail():
    doc = json.loads(render_record(hostile_finding(), "ecs", HOST))
    assert ecs_errors(doc) == []
    doc["process"]["pid"] = "66"
    doc["process"]["commandline"] = "x"
    doc["event"]["type"] = ["blocked"]
    doc["event"]["kind"] = ["alert"]
    assert len(ecs_errors(doc)) == 4


def test_every_record_kind_pairs_category_and_type_as_ecs_expects(corpus):
    """Each ECS record's event.category and event.type follow expected_event_types of Elastic's
    ECS package (@elastic/ecs 8.11.5, tests/data/ecs_flat_8.11.json): process findings' creates,
    updates and closes, every GPU host rule's, every action and every lifecycle event."""
    expected = ecs_fields()["event.category"]["expected_event_types"]
    assert {c: tuple(expected[c]) for c in EXPECTED_EVENT_TYPES} == EXPECTED_EVENT_TYPES
    checks = [HostFinding(rule, "x", "y") for rule in HOST_RULES]
    apply_thresholds(checks, Thresholds(40, 75))
    hosts = [finding_from_host(h, a) for h in checks for a in ("create", "update", "close")]
    seen: dict[str, set] = {"finding": set(), "action": set(), "lifecycle": set()}
    for record in [*corpus, *hosts]:
        doc = json.loads(render_record(record, "ecs", HOST))
        assert ecs_pair_errors(doc) == [], (type(record).__name__, doc["event"])
        kind = {Finding: "finding", ActionOutcome: "action", AgentLifecycle: "lifecycle"}
        seen[kind[type(record)]].add(doc["event"]["action"])
        # every category gpuguard writes is one whose expected types it knows
        assert set(doc["event"]["category"]) <= set(EXPECTED_EVENT_TYPES), doc["event"]
    assert {"process-ended", "host-resolved"} <= seen["finding"]
    assert set(_ACTION_ECS_TYPE) <= seen["action"] and set(LIFECYCLE_ACTIONS) <= seen["lifecycle"]
    # the pairs the SIEM engineer found, as the records had them: refused
    finding = lifecycle_findings()[1]
    finding.categories = ["process", "intrusion_detection"]  # as finding_from_verdict sets them
    update = json.loads(render_record(finding, "ecs", HOST))
    assert update["event"]["type"] == ["info"] and finding.activity == "update"
    update["event"]["type"] = ["change"]  # what it was
    assert ecs_pair_errors(update) == [
        "event.type 'change' is not expected under event.category 'intrusion_detection'"
    ]
    # a category that expects none of the record's types is left out: ld.so.preload's rule is
    # in configuration and library, and library expects only `start`
    preload = next(h for h in hosts if h.rule_id == "host-ld-so-preload")
    doc = json.loads(render_record(preload, "ecs", HOST))
    assert preload.categories == ["configuration", "library"]
    assert (doc["event"]["category"], doc["event"]["type"]) == (["configuration"], ["info"])


def test_every_ecs_record_uses_only_ecs_fields_of_the_right_type(corpus):
    for record in corpus:
        doc = json.loads(render_record(record, "ecs", HOST))
        assert ecs_errors(doc) == [], type(record).__name__
    document = scan_document(scan_report([r for r in corpus if isinstance(r, Finding)]), "json")
    for doc in document["findings"]:
        assert ecs_errors(json.loads(json.dumps(doc, default=str))) == []


# -- CEF --------------------------------------------------------------------------------------

ROUND_TRIP = [
    "pe\\bs",
    "a=b c=d",
    "x|y|z",
    "two\nlines\r\nhere",
    "trailing\\",
    "\\=\\n",
    "bad\udcffutf8\udc80",
    "esc\x1b[31mred\x07",
    " lead and trail ",
    "ünïcødé ✓",
]


def test_cef_escapes_once_and_a_strict_parser_gets_the_values_back():
    for value in ROUND_TRIP:
        outcome = ActionOutcome(
            time=1.0, action="kill", status="done", pid=9, comm=value, exe=f"/opt/{value}",
            reason=value, detail={"k": value},
        )  # fmt: skip
        header, ext = strict_cef(render_record(outcome, "cef", HOST))
        expected = visible_text(value, keep="\n\r")  # only what CEF cannot carry is written as text
        assert (ext["sproc"], ext["filePath"], ext["msg"]) == (
            expected,
            f"/opt/{expected}",
            expected,
        )
        if "\\" not in value and "\\udc" not in ascii(value) and "\x1b" not in value:
            assert ext["sproc"] == value  # exact: nothing was escaped twice
        assert json.loads(ext["cs6"]) == {"k": value}  # JSON in a value: exact, \\udcff included
    finding = hostile_finding()
    finding.rule_id = "rule|with\\pipe"
    finding.rule_description = "desc | = \\ \n end"
    header, ext = strict_cef(render_record(finding, "cef", HOST))
    assert header[4] == "rule|with\\pipe"
    assert header[5] == "desc | = \\ \\n end"  # a header cannot carry a line break: shown as text
    assert ext["sproc"] == visible_text(HOSTILE, keep="\n\r")
    assert ext["cs5"] == visible_text(f"{HOSTILE} -o", keep="\n\r")


def test_the_strict_parser_refuses_double_escaping():
    with pytest.raises(ValueError, match="bad extension escape"):
        strict_cef("CEF:0|v|p|1|s|n|5|sproc=pe\\\\\\bs")
    with pytest.raises(ValueError, match="unescaped '='"):
        strict_cef("CEF:0|v|p|1|s|n|5|msg=a=b")


def test_every_cef_record_parses_strictly(corpus):
    for record in corpus:
        header, ext = strict_cef(render_record(record, "cef", HOST))
        assert len(header) == 7 and header[1] == "gpuguard" and ext["dvchost"] == "gpu-node-7"
        if "flexString1" in ext:
            assert ext["flexString1Label"] == "truncated" and json.loads(ext["flexString1"])


def test_formats_are_the_three_covered_here():
    assert FORMATS == ("ecs", "ocsf", "cef")


# -- the process finding lifecycle --------------------------------------------------------------


def test_a_finding_keeps_its_id_and_each_record_has_its_own():
    create, update, close = lifecycle_findings()
    ecs = [json.loads(render_record(f, "ecs", HOST)) for f in (create, update, close)]
    ocsf = [json.loads(render_record(f, "ocsf", HOST)) for f in (create, update, close)]
    cef = [strict_cef(render_record(f, "cef", HOST))[1] for f in (create, update, close)]
    fid, run = create.finding_id, create.run_id
    assert [d["gpuguard"]["finding"]["id"] for d in ecs] == [fid] * 3
    assert [d["event"]["id"] for d in ecs] == [f"{fid}-{run}-0", f"{fid}-{run}-1", f"{fid}-{run}-2"]
    assert [d["metadata"]["uid"] for d in ocsf] == [d["event"]["id"] for d in ecs]
    assert [json.loads(e["cs6"])["record_id"] for e in cef] == [d["event"]["id"] for d in ecs]
    assert [d["gpuguard"]["finding"]["run_id"] for d in ecs] == [run] * 3
    assert [d["finding_info"]["uid"] for d in ocsf] == [fid] * 3
    assert [e["externalId"] for e in cef] == [fid] * 3
    assert [d["event"]["type"] for d in ecs] == [["info"], ["change"], ["end"]]
    assert [(d["activity_id"], d["activity_name"]) for d in ocsf] == [
        (1, "Create"),
        (2, "Update"),
        (3, "Close"),
    ]
    assert ocsf[2]["status"] == "Resolved" and ocsf[2]["status_detail"] == "process ended"
    assert ecs[2]["event"]["action"] == "process-ended" and ecs[2]["event"]["kind"] == "event"
    assert ecs[2]["event"]["duration"] == 299_500_000_000
    assert ecs[2]["process"]["exit_code"] == 137
    totals = ecs[2]["gpuguard"]["finding"]["totals"]
    assert totals["gpu_s"] == 250.0 and totals["bytes_out"] == 4096 and totals["actions_total"] == 1
    assert ocsf[2]["unmapped"]["gpuguard"]["finding"]["totals"] == totals
    assert json.loads(cef[2]["cs6"])["totals"] == totals
    assert ecs[1]["gpuguard"]["finding"]["changes"] == ["gpu", "destination", "rules"]


def test_every_record_names_what_a_responder_needs():
    for finding in lifecycle_findings():
        ecs = json.loads(render_record(finding, "ecs", HOST))
        ocsf = json.loads(render_record(finding, "ocsf", HOST))
        _, cef = strict_cef(render_record(finding, "cef", HOST))
        assert ecs["destination"] == {
            "address": "127.0.0.1", "ip": "127.0.0.1", "port": 3333, "domain": "pool.example.org",
        }  # fmt: skip
        assert ocsf["evidences"][0]["dst_endpoint"]["port"] == 3333
        assert (cef["dst"], cef["dpt"], cef["dhost"]) == ("127.0.0.1", "3333", "pool.example.org")
        assert ecs["process"]["hash"]["sha256"] == "ab" * 32 == cef["fileHash"]
        assert ocsf["evidences"][0]["process"]["file"]["hashes"][0]["value"] == "ab" * 32
        assert [a["pid"] for a in ecs["gpuguard"]["ancestors"]] == [40, 30, 1]
        chain, parent = [], ocsf["evidences"][0]["process"]
        while "parent_process" in parent:
            parent = parent["parent_process"]
            chain.append(parent["pid"])
        assert chain == [40, 30, 1]
        assert ecs["container"]["id"] == "c" * 64 and ecs["orchestrator"]["resource"]["id"]
        assert ecs["orchestrator"]["resource"]["name"] == "trainer-7"
        assert (
            ecs["orchestrator"]["namespace"] == "ml-team" and ecs["container"]["name"] == "worker"
        )
        assert ocsf["evidences"][0]["process"]["container"]["name"] == "worker"
        assert json.loads(cef["cs6"])["pod"] == "ml-team/trainer-7"
        assert ocsf["evidences"][0]["process"]["container"]["pod_uuid"]
        if finding.gpu is not None:
            assert ecs["gpuguard"]["gpu"]["device_paths"] == ["/dev/nvidia0"]
            assert ecs["gpuguard"]["gpu"]["memory_share"] == 0.75
            assert ocsf["unmapped"]["gpuguard"]["gpu"]["shared"] is True
            assert json.loads(cef["cs6"])["gpu"]["memory_share"] == 0.75


def test_the_finding_id_survives_the_smallest_budget():
    limits = OutputLimits(record=1024)
    for finding in lifecycle_findings():
        finding.process.command_line = ["x" * 100_000]
        finding.process.ancestors = [{"pid": 9, "name": "n" * 5000, "executable": "/" + "e" * 5000}]
        ecs = json.loads(render_record(finding, "ecs", HOST, limits))
        ocsf = json.loads(render_record(finding, "ocsf", HOST, limits))
        _, cef = strict_cef(render_record(finding, "cef", HOST, limits))
        assert ecs["gpuguard"]["finding"]["id"] == finding.finding_id == cef["externalId"]
        assert ecs["event"]["id"] == finding.record_id
        assert ocsf["finding_info"]["uid"] == finding.finding_id
        assert ocsf["activity_id"] == {"create": 1, "update": 2, "close": 3}[finding.activity]


def test_a_continued_finding_says_so_in_every_format_and_validates():
    """The record that picks up a finding an earlier agent run left open (docs/siem.md,
    "Restarts"): the same finding id, its own record id, ``continued`` in each format."""
    create = lifecycle_findings()[0]
    create.sequence, create.continued = 4, True
    ecs = json.loads(render_record(create, "ecs", HOST))
    ocsf = json.loads(render_record(create, "ocsf", HOST))
    _, cef = strict_cef(render_record(create, "cef", HOST))
    assert ecs_errors(ecs) == [] and ocsf_errors(ocsf) == []
    record_id = f"{create.finding_id}-{create.run_id}-4"
    assert ecs["event"]["id"] == ocsf["metadata"]["uid"] == record_id
    assert ecs["gpuguard"]["finding"]["continued"] is True
    assert ocsf["unmapped"]["gpuguard"]["finding"]["continued"] is True
    assert json.loads(cef["cs6"])["continued"] is True and cef["externalId"] == create.finding_id
    plain = lifecycle_findings()[0]  # a new finding carries no mark
    assert "continued" not in json.loads(render_record(plain, "ecs", HOST))["gpuguard"]["finding"]
    create.process.command_line = ["x" * 100_000]  # the smallest budget keeps id and mark
    create.process.ancestors = [{"pid": 9, "name": "n" * 5000, "executable": "/" + "e" * 5000}]
    small = json.loads(render_record(create, "ecs", HOST, OutputLimits(record=1024)))
    assert small["event"]["id"] == record_id and small["gpuguard"]["finding"]["continued"] is True


def test_every_format_says_whether_a_score_was_capped_and_why():
    capped, plain = capped_finding(), hostile_finding(50, "suspicious")
    ecs = json.loads(render_record(capped, "ecs", HOST))["gpuguard"]
    assert ecs["score_capped"] is True and ecs["score_cap"]["uncapped_score"] == 45
    assert "generic evidence only" in ecs["score_cap"]["reason"]
    assert json.loads(render_record(plain, "ecs", HOST))["gpuguard"]["score_capped"] is False
    ocsf = json.loads(render_record(capped, "ocsf", HOST))["unmapped"]["gpuguard"]
    assert ocsf["score_capped"] is True and ocsf["score_cap"]["limit"] == 39
    plain_ocsf = json.loads(render_record(plain, "ocsf", HOST))["unmapped"]["gpuguard"]
    assert plain_ocsf["score_capped"] is False and "score_cap" not in plain_ocsf
    _, cef = strict_cef(render_record(capped, "cef", HOST))
    assert (cef["cn2Label"], cef["cn2"], cef["cn3Label"], cef["cn3"]) == (
        "scoreCapped",
        "1",
        "uncappedScore",
        "45",
    )
    _, plain_cef = strict_cef(render_record(plain, "cef", HOST))
    assert plain_cef["cn2"] == "0" and "cn3" not in plain_cef
    # a host finding has no process score to cap: nothing is said
    host = finding_from_host(
        HostFinding("host-persistence-miner", "/etc/cron.d/x", "x", ["x"]), "create", 5.0
    )
    assert "score_capped" not in json.loads(render_record(host, "ecs", HOST))["gpuguard"]
