"""Renderers of `gpuguard scan`: ECS and OCSF mapping, the console table, escaping."""

from __future__ import annotations

import io
import json

from rich.console import Console

from gpuguard.detect.host.checks import HostFinding, apply_thresholds
from gpuguard.detect.ruleset.model import Thresholds
from gpuguard.outputs.ecs import finding_to_ecs, threat_fields
from gpuguard.outputs.finding import (
    finding_from_host,
)
from gpuguard.outputs.jsonl import dumps_line
from gpuguard.outputs.ocsf import finding_to_ocsf, finding_uid
from gpuguard.outputs.scan_report import render_console, scan_document
from tests.support.findings import EVIL_NAME, process_finding, scan_report
from tests.support.json_shapes import (
    ECS_FINDING_SHAPE,
    OCSF_FINDING_SHAPE,
    SCAN_DOCUMENT_SHAPE,
    shape_errors,
)


def test_ecs_process_fields_nested():
    doc = finding_to_ecs(process_finding(), 1_700_000_001.0, {"hostname": "h1"})
    assert shape_errors(doc, ECS_FINDING_SHAPE) == []
    assert doc["process"]["pid"] == 4242
    assert doc["process"]["name"] == EVIL_NAME  # structured field: exact value
    assert doc["process"]["command_line"] == "/dev/shm/.x/kworker -o stratum+tcp://pool:3333"
    assert doc["process"]["parent"] == {
        "pid": 1,
        "name": "systemd",
        "executable": "/usr/lib/systemd/systemd",
    }
    assert doc["process"]["start"] == "2023-11-14T22:13:20.250Z"
    assert doc["user"] == {"id": "1000", "name": "bob"}
    assert doc["container"] == {"id": "a" * 64, "runtime": "containerd"}
    assert doc["orchestrator"] == {
        "type": "kubernetes",
        "resource": {"type": "pod", "id": "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"},
    }
    assert (
        doc["event"]["kind"] == "alert"
        and doc["event"]["severity"] == 73
        and doc["event"]["risk_score"] == 80
    )
    assert doc["rule"]["id"] == "miner-cmdline-stratum"
    assert not any("." in key for key in doc)  # nested objects, never dotted keys
    # one JSON escaping rule (outputs/jsonl): sentences hold the exact text, escaped once, by JSON
    assert EVIL_NAME in doc["message"] and "\\x1b" not in doc["message"]
    line = dumps_line(doc)
    assert "\x1b" not in line and "\x07" not in line and "\\u001b]0;pwned\\u0007" in line
    assert doc["gpuguard"]["rule_ids"] == ["miner-cmdline-stratum", "masquerade-kernel-thread"]
    assert doc["gpuguard"]["executable_deleted"] is True


def test_ecs_event_kind_is_alert_only_at_or_above_the_suspicious_threshold():
    # A score-10 clean finding is an event, not an alert a SIEM would page on.
    kinds = {
        verdict: finding_to_ecs(process_finding(score, verdict), 1.0, {"hostname": "h1"})["event"][
            "kind"
        ]
        for score, verdict in ((10, "clean"), (50, "suspicious"), (95, "malicious"))
    }
    assert kinds == {"clean": "event", "suspicious": "alert", "malicious": "alert"}
    clean = finding_to_ecs(process_finding(10, "clean"), 1.0, {"hostname": "h1"})
    assert shape_errors(clean, ECS_FINDING_SHAPE) == []


def test_ecs_threat_subtechniques_and_tactics():
    threat = threat_fields(
        [("T1496", "Resource Hijacking"), ("T1053.003", "Scheduled Task/Job: Cron")]
    )
    assert threat["technique"]["id"] == ["T1496", "T1053"]
    assert threat["technique"]["name"] == ["Resource Hijacking", "Scheduled Task/Job"]
    assert threat["technique"]["subtechnique"] == {
        "id": ["T1053.003"],
        "name": ["Cron"],
        "reference": ["https://attack.mitre.org/techniques/T1053/003/"],
    }
    assert threat["tactic"]["id"] == ["TA0040", "TA0002", "TA0003", "TA0004"]


def test_ocsf_detection_finding_fields():
    event = finding_to_ocsf(process_finding(), 1_700_000_001.0, "h1")
    assert shape_errors(event, OCSF_FINDING_SHAPE) == []
    assert (event["class_uid"], event["category_uid"], event["activity_id"], event["type_uid"]) == (
        2004,
        2,
        1,
        200401,
    )
    assert event["severity_id"] == 4 and event["severity"] == "High"
    assert event["time"] == 1_700_000_001_000
    assert event["metadata"]["product"]["name"] == "gpuguard"
    evidence = event["evidences"][0]
    assert evidence["process"]["pid"] == 4242
    assert evidence["process"]["created_time"] == 1_700_000_000_250
    assert evidence["process"]["parent_process"]["pid"] == 1
    assert evidence["container"] == {
        "uid": "a" * 64,
        "runtime": "containerd",
        "pod_uuid": "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0",
    }
    assert [a["technique"]["uid"] for a in event["finding_info"]["attacks"]] == ["T1496", "T1036"]
    assert event["finding_info"]["attacks"][0]["tactic"] == {"uid": "TA0040", "name": "Impact"}
    assert {"type": "container", "uid": "a" * 64} in event["resources"]


def test_ocsf_uid_is_stable_per_process_and_rule():
    a, b = process_finding(), process_finding(score=50, verdict="suspicious")
    assert finding_uid(a, "h1") == finding_uid(b, "h1")
    assert finding_uid(a, "h1") != finding_uid(a, "h2")


def test_host_finding_renders_with_file_path():
    host = HostFinding(
        "host-persistence-miner",
        "/etc/cron.d/x",
        "cron /etc/cron.d/x starts a miner (miner xmrig)",
        ["/etc/cron.d/x:1: * * * * * root xmrig"],
    )
    apply_thresholds([host], Thresholds(40, 75))
    finding = finding_from_host(host)
    doc = finding_to_ecs(finding, 1.0)
    assert doc["file"] == {"path": "/etc/cron.d/x"}
    assert "process" not in doc
    assert doc["gpuguard"]["verdict"] == "malicious"
    event = finding_to_ocsf(finding, 1.0, "h1")
    assert event["evidences"][0]["file"]["path"] == "/etc/cron.d/x"


def test_table_escapes_names_and_ignores_markup():
    out = io.StringIO()
    render_console(
        scan_report([process_finding()]), Console(file=out, width=200, color_system=None)
    )
    text = out.getvalue()
    assert "\x1b" not in text and "\x07" not in text
    assert "\\x1b]0;pwned\\x07[bold red]x[/]" in text  # printed literally, not as markup
    assert "not seen: could not read /proc/PID/exe for 3 processes" in text
    assert text.rstrip().splitlines()[-1] == (
        "scanned 123 processes in 1.50 s: 1 malicious, 0 suspicious, "
        "0 below threshold; 1 blind spots"
    )


def test_document_envelope_and_exit_code():
    clean = scan_report([process_finding(score=20, verdict="clean")])
    assert clean.exit_code == 0
    alerting = scan_report([process_finding()])
    assert alerting.exit_code == 1
    doc = json.loads(json.dumps(scan_document(alerting, "json")))
    assert shape_errors(doc, SCAN_DOCUMENT_SHAPE) == []
    assert doc["summary"]["exit_code"] == 1 and doc["summary"]["processes_scanned"] == 123
    assert doc["scanner"]["schema"]["name"] == "ecs"
    ocsf = scan_document(alerting, "ocsf")
    assert ocsf["findings"][0]["class_uid"] == 2004
