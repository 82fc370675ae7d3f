"""docs/siem.md says what the outputs write: the finding lifecycle table and its example are held
to the records the ECS, OCSF and CEF formats render for a process finding's create, update and
close."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.support.findings import lifecycle_findings
from tests.support.records import render_record

SIEM_DOC = Path(__file__).resolve().parent.parent / "docs" / "siem.md"
ACTIVITIES = ("create", "update", "close")


def _section(title: str) -> str:
    text = SIEM_DOC.read_text()
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def _rendered() -> dict[str, dict[str, object]]:
    """Each activity's record in every format, for a process finding (whose categories are
    always process and intrusion_detection, outputs/finding.py)."""
    out: dict[str, dict[str, object]] = {}
    for finding in lifecycle_findings():
        finding.categories = ["process", "intrusion_detection"]
        out[finding.activity] = {
            "ecs": json.loads(render_record(finding, "ecs")),
            "ocsf": json.loads(render_record(finding, "ocsf")),
            "cef": render_record(finding, "cef"),
        }
    return out


def test_the_finding_lifecycle_table_says_what_each_format_writes():
    rendered = _rendered()
    rows = {}
    for line in _section("Finding lifecycle").splitlines():
        found = re.match(r"\| \*\*(create|update|close)\*\* \|", line)
        if found:
            rows[found.group(1)] = [c.strip() for c in line.strip("|").split(" | ")]
    assert set(rows) == set(ACTIVITIES)
    for activity in ACTIVITIES:
        _, _, ecs_cell, ocsf_cell, cef_cell = rows[activity]
        ecs, ocsf, cef = (rendered[activity][f] for f in ("ecs", "ocsf", "cef"))
        assert f"`event.type: {json.dumps(ecs['event']['type'])}`" in ecs_cell, activity
        assert f"`gpuguard.finding.activity: {activity}`" in ecs_cell, activity
        for field in ("action", "kind"):  # where the table names them
            said = re.search(rf"`event\.{field}: ([\w-]+)`", ecs_cell)
            assert said is None or said.group(1) == ecs["event"][field], (activity, field)
        assert f"activity {ocsf['activity_id']} {ocsf['activity_name']}" in ocsf_cell, activity
        assert f"status {ocsf['status']}" in ocsf_cell, activity
        act = re.search(r"act=([\w-]+)", cef_cell)
        if act:
            assert f"act={act.group(1)} " in cef, (activity, cef)


def test_the_finding_lifecycle_example_has_the_fields_the_agent_writes():
    rendered = _rendered()
    block = _section("Finding lifecycle").split("```json\n", 1)[1].split("```", 1)[0]
    decoder, pos, examples = json.JSONDecoder(), 0, []
    while block[pos:].strip():
        pos += len(block[pos:]) - len(block[pos:].lstrip())
        doc, pos = decoder.raw_decode(block, pos)
        examples.append(doc)
    assert [e["gpuguard"]["finding"]["activity"] for e in examples] == list(ACTIVITIES)
    for example in examples:
        activity = example["gpuguard"]["finding"]["activity"]
        ecs = rendered[activity]["ecs"]
        for field in ("kind", "action", "type"):
            assert example["event"][field] == ecs["event"][field], (activity, field)
        assert set(example["gpuguard"]["finding"]) <= set(ecs["gpuguard"]["finding"]), activity
