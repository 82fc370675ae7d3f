"""`gpuguard scan` finds a real miner-like process on this host, and leaves ordinary ones alone.

One miner stand-in (tests/support/scan.py) runs for the whole module: a
renamed, deleted binary under /tmp with a kernel-thread comm, stratum
arguments, a live connection to a loopback pool and GPU-named device handles
from a private /dev.  Each output format is produced once and checked.
"""

from __future__ import annotations

import json
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.json_shapes import (
    ECS_FINDING_SHAPE,
    OCSF_FINDING_SHAPE,
    SCAN_DOCUMENT_SHAPE,
    shape_errors,
)
from tests.support.scan import (
    REPO,
    findings_for_pid,
    pool_listener,
    run_scan,
    sleeper,
    started_miner,
    write_rules_override,
)

pytestmark = [pytest.mark.root, pytest.mark.self_contained]


@pytest.fixture(scope="module")
def live_host():
    """The miner, an ordinary sleeper, and one scan in each output format."""
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="gg-scan-") as tmp:
        workdir = Path(tmp)
        with (
            pool_listener() as pool,
            started_miner(workdir, pool.port) as miner,
            sleeper() as sleep_proc,
        ):
            assert pool.got_line.wait(5), "the miner never reached the pool"
            rules = [
                "--rules",
                str(REPO / "rules" / "miner-rules.yaml"),
                "--rules",
                str(write_rules_override(workdir / "pool-port.yaml", pool.port)),
            ]
            # The three scans run side by side (each spends most of its GPU window waiting).
            with ThreadPoolExecutor(3) as pool_of_scans:
                json_run, ocsf_run, table_run = pool_of_scans.map(
                    lambda argv: run_scan(*argv, *rules), [["--json"], ["--format", "ocsf"], []]
                )
            yield {
                "miner": miner,
                "pool": pool,
                "sleep_pid": sleep_proc.pid,
                "json": json_run,
                "ocsf": ocsf_run,
                "table": table_run,
            }


def _ecs(live_host) -> dict:
    run = live_host["json"]
    assert "Traceback" not in run.stderr, run.stderr
    return json.loads(run.stdout)


def test_pool_saw_the_stratum_subscribe(live_host):
    assert b'"method":"mining.subscribe"' in live_host["pool"].lines[0]
    assert live_host["miner"]["ready"] == "ready gpu=3 pool=1"


def test_miner_is_malicious_with_the_right_evidence(live_host):
    doc = _ecs(live_host)
    miner = live_host["miner"]
    found = findings_for_pid(doc, miner["pid"])
    assert len(found) == 1, [f["process"] for f in doc["findings"] if "process" in f]
    finding = found[0]
    assert finding["gpuguard"]["verdict"] == "malicious"
    assert finding["gpuguard"]["score"] == 100
    rule_ids = set(finding["gpuguard"]["rule_ids"])
    # cmdline, masquerading, hiding, network and GPU evidence, each from its own rule
    assert {
        "miner-cmdline-stratum",
        "miner-cmdline-wallet",
        "miner-cmdline-flags",
        "miner-binary-name",
        "masquerade-kernel-thread",
        "masquerade-name-mismatch",
        "exe-deleted",
        "exe-in-temp-dir",
        "net-pool-port",
        "net-connected-to-configured-pool",
        "gpu-compute-by-masquerader",
        "gpu-compute-from-temp-dir",
    } <= rule_ids
    process = finding["process"]
    assert process["name"] == "kworker/0:2"
    assert process["executable"] == miner["exe"]
    assert process["args"] == miner["argv"]
    assert finding["gpuguard"]["executable_deleted"] is True
    port_evidence = next(
        e for e in finding["gpuguard"]["evidence"] if e["rule_id"] == "net-pool-port"
    )
    assert str(live_host["pool"].port) in port_evidence["detail"]
    assert finding["event"]["risk_score"] == 100
    assert finding["event"]["severity"] == 99
    assert "T1496" in finding["threat"]["technique"]["id"]
    assert "T1036" in finding["threat"]["technique"]["id"]  # masquerading rules cite it


def test_ordinary_process_is_not_flagged(live_host):
    doc = _ecs(live_host)
    # The same scan saw and flagged the miner: an empty list for the sleeper means
    # "looked at and found clean", not "the scan reported nothing at all".
    assert findings_for_pid(doc, live_host["miner"]["pid"]) != []
    assert doc["summary"]["processes_scanned"] >= 3
    assert findings_for_pid(doc, live_host["sleep_pid"]) == []
    assert str(live_host["sleep_pid"]) not in json.dumps(doc["findings"])


def test_exit_code_is_one_when_something_is_suspicious(live_host):
    assert live_host["json"].returncode == 1
    assert _ecs(live_host)["summary"]["exit_code"] == 1
    assert _ecs(live_host)["summary"]["malicious"] >= 1


def test_json_document_has_the_documented_shape(live_host):
    doc = _ecs(live_host)
    assert shape_errors(doc, SCAN_DOCUMENT_SHAPE) == []
    assert doc["findings"], "no findings at all"
    for finding in doc["findings"]:
        assert shape_errors(finding, ECS_FINDING_SHAPE) == [], finding.get("rule")
        # a SIEM pages on alerts: only suspicious and malicious verdicts are alerts
        assert (finding["event"]["kind"] == "alert") == (finding["gpuguard"]["verdict"] != "clean")
    # the validator itself can fail
    broken = json.loads(json.dumps(doc["findings"][0]))
    broken["event"]["kind"] = "signal"
    del broken["rule"]["id"]
    assert len(shape_errors(broken, ECS_FINDING_SHAPE)) == 2


def test_findings_sorted_by_score(live_host):
    scores = [f["gpuguard"]["score"] for f in _ecs(live_host)["findings"]]
    assert scores == sorted(scores, reverse=True)


def test_ocsf_detection_finding(live_host):
    run = live_host["ocsf"]
    assert run.returncode == 1 and "Traceback" not in run.stderr
    doc = json.loads(run.stdout)
    assert doc["scanner"]["schema"]["name"] == "ocsf"
    for finding in doc["findings"]:
        assert shape_errors(finding, OCSF_FINDING_SHAPE) == []
    miner = next(
        f
        for f in doc["findings"]
        if f["evidences"]
        and f["evidences"][0].get("process", {}).get("pid") == live_host["miner"]["pid"]
    )
    assert miner["severity_id"] == 5 and miner["severity"] == "Critical"
    assert miner["type_uid"] == 200401
    assert miner["finding_info"]["analytic"] == {
        "uid": "yara-miner",
        "name": "yara-miner",
        "type_id": 1,
        "type": "Rule",
        "category": "stable",  # the rule's tier (issue 39)
    }
    assert miner["evidences"][0]["process"]["file"]["path"] == live_host["miner"]["exe"]
    rules = {e["data"]["rule_id"] for e in miner["evidences"]}
    assert "miner-cmdline-stratum" in rules


def test_table_names_the_miner_and_ends_with_a_summary(live_host):
    run = live_host["table"]
    assert run.returncode == 1 and "Traceback" not in run.stderr
    lines = run.stdout.splitlines()
    row = next(line for line in lines if f" {live_host['miner']['pid']} " in line)
    assert "malicious" in row and "kworker/0:2" in row
    assert lines[-1].startswith("scanned ") and "malicious" in lines[-1]
