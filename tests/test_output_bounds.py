"""Log records are bounded: capped fields carry their original length and sha256, a record fits 8 KiB."""

from __future__ import annotations

import hashlib
import json
import re

import pytest

from gpuguard.agent.config import load_config
from gpuguard.errors import GpuguardError
from gpuguard.events.agent_events import ActionOutcome, AgentLifecycle
from gpuguard.outputs.bounds import OutputLimits, cap_text
from gpuguard.outputs.records import FORMATS
from tests.support.cef import parse_cef
from tests.support.findings import CMDLINE, EXE, HOST, NAME, hostile_records, huge_finding
from tests.support.records import render_record


def sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


def size(text: str) -> int:
    return len(text.encode("utf-8", "surrogateescape"))


def assert_one_clean_line(line: str, budget: int = 8192) -> None:
    data = line.encode("utf-8")  # strict UTF-8: an invalid byte is the text \xNN
    assert len(data) <= budget, len(data)
    assert b"\n" not in data and b"\r" not in data
    assert not re.search(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]", line), ascii(line[:200])


def test_a_huge_finding_fits_8_kib_in_every_format_with_marks():
    finding = huge_finding()
    for fmt in FORMATS:
        line = render_record(finding, fmt, HOST)
        assert_one_clean_line(line)
        assert line == render_record(finding, fmt, HOST)  # deterministic

    ecs = json.loads(render_record(finding, "ecs", HOST))
    marks = ecs["gpuguard"]["truncated"]["process"]
    joined = " ".join(CMDLINE)
    assert marks["command_line"] == {"original_length": size(joined), "sha256": sha(joined)}
    assert marks["executable"] == {"original_length": size(EXE), "sha256": sha(EXE)}
    assert marks["name"] == {"original_length": size(NAME), "sha256": sha(NAME)}
    argv = "\0".join(CMDLINE)
    assert marks["args"] == {
        "original_length": size(argv),
        "sha256": sha(argv),
        "original_count": 10_001,
    }
    assert ecs["process"]["args_count"] == 10_001  # the real count survives
    assert ecs["process"]["executable"].startswith("/tmp/e\\e\\")  # the kept prefix is exact
    assert CMDLINE[0].startswith(ecs["process"]["command_line"][:64])
    assert ecs["gpuguard"]["evidence_omitted"] >= 490
    kept = ecs["gpuguard"]["evidence"]
    assert kept and kept[0]["weight"] == 49.0  # the heaviest first
    assert "evidence" in ecs["gpuguard"]["shed"]

    ocsf = json.loads(render_record(finding, "ocsf", HOST))
    gg = ocsf["unmapped"]["gpuguard"]
    process_marks = gg["truncated"]["evidences"]["0"]["process"]
    assert process_marks["cmd_line"] == {"original_length": size(joined), "sha256": sha(joined)}
    assert process_marks["file"]["path"] == {"original_length": size(EXE), "sha256": sha(EXE)}
    assert gg["evidence_omitted"] + len(ocsf["evidences"]) == 500

    header, ext = parse_cef(render_record(finding, "cef", HOST))
    assert ext["flexString1Label"] == "truncated"
    cef_marks = json.loads(ext["flexString1"])
    assert cef_marks["cs5"] == {"original_length": size(joined), "sha256": sha(joined)}
    assert cef_marks["filePath"] == {"original_length": size(EXE), "sha256": sha(EXE)}
    assert cef_marks["sproc"] == {"original_length": size(NAME), "sha256": sha(NAME)}
    assert ext["filePath"].startswith("/tmp/e\\e\\")  # escaped once: decodes to the real bytes
    assert "\\x1b" in ext["sproc"] and "\\xfe" in ext["sproc"] and "\n" in ext["sproc"]


def test_a_small_finding_is_not_marked():
    for fmt in FORMATS:
        for record in hostile_records():
            line = render_record(record, fmt, HOST)
            assert "truncated" not in line and '"shed"' not in line


def test_each_field_cap_and_the_record_budget_are_configurable(tmp_path):
    finding = huge_finding()
    limits = OutputLimits(cmdline=256, arg=64, name=64, record=4096, evidence=2)
    for fmt in ("ecs", "ocsf", "cef"):
        assert_one_clean_line(render_record(finding, fmt, HOST, limits), 4096)
    ecs = json.loads(render_record(finding, "ecs", HOST, limits))
    assert len(ecs["process"]["command_line"].encode()) <= 256
    assert all(len(a.encode()) <= 64 for a in ecs["process"]["args"])
    assert len(ecs["gpuguard"]["evidence"]) <= 2

    config = tmp_path / "agent.yaml"
    config.write_text("log:\n  limits:\n    cmdline_bytes: 2048\n    record_bytes: 16384\n")
    assert load_config(config).log_limits == {"cmdline": 2048, "record": 16384}
    config.write_text("log:\n  limits:\n    record_bytes: 10\n")
    with pytest.raises(GpuguardError, match="record_bytes 10 is outside"):
        load_config(config)


def test_huge_actions_and_lifecycle_records_fit_too():
    action = ActionOutcome(
        time=1.0,
        action="block-egress",
        status="done",
        pid=66,
        comm=NAME,
        exe=EXE,
        reason="r" * 50_000,
        detail={"addresses": [f"10.0.{i // 256}.{i % 256}" for i in range(5000)], "x": NAME},
    )
    fault = AgentLifecycle(time=2.0, action="fault", message=NAME * 10, detail={"path": EXE})
    for record in (action, fault):
        for fmt in FORMATS:
            line = render_record(record, fmt, HOST)
            assert_one_clean_line(line)
            assert "truncated" in line


def test_a_record_over_budget_at_the_floor_keeps_its_skeleton():
    """Many long fields and a tiny budget: what is left is the fixed skeleton, marked."""
    finding = huge_finding()
    limits = OutputLimits(record=1024)
    ecs = json.loads(render_record(finding, "ecs", HOST, limits))
    assert ecs["gpuguard"]["shed"][-1] == "fields"
    assert ecs["event"]["kind"] == "alert" and ecs["process"]["pid"] == 66
    assert set(ecs["gpuguard"]["truncated"]["record"]) == {"original_length", "sha256"}
    for fmt in (f for f in FORMATS if f != "ecs"):  # ecs: read field by field above
        assert_one_clean_line(render_record(finding, fmt, HOST, limits), 1024)


def test_cap_text_cuts_on_a_character_boundary():
    text, mark = cap_text("é" * 10, 5)  # 2 bytes each: 5 bytes would split the third
    assert text == "éé" and mark == {"original_length": 20, "sha256": sha("é" * 10)}
    assert cap_text("short", 5) == ("short", None)
    text, mark = cap_text("\udcff" * 10, 4)  # invalid bytes count one each and are kept
    assert text == "\udcff" * 4 and mark["original_length"] == 10
