"""Every JSON output is valid UTF-8 JSON under one escaping rule, whatever the strings hold.

All 256 byte values (decoded as the sensor does, with ``surrogateescape``) go
through every string field of every event kind, process facts, GPU snapshots,
the ``gpus`` view and the ``scan`` ECS/OCSF documents.
"""

from __future__ import annotations

import dataclasses
import typing

import pytest

from gpuguard.detect.scoring.score import Evidence
from gpuguard.events.gpu_snapshot import DeviceSample, GpuSnapshot, ProcessGpuUsage
from gpuguard.events.model import EVENT_TYPES, Exec, NetPayload
from gpuguard.events.process_facts import Ancestor, ProcessFacts
from gpuguard.outputs.ecs import finding_to_ecs
from gpuguard.outputs.finding import Finding, ProcessInfo
from gpuguard.outputs.gpu_table import GpuView, ProcessLabel, view_to_json
from gpuguard.outputs.jsonl import dumps_document, dumps_line
from gpuguard.outputs.ocsf import finding_to_ocsf
from gpuguard.outputs.records import SCAN_FORMATS
from gpuguard.outputs.scan_report import ScanReport, scan_document
from gpuguard.sources.host.gpu_stack import GpuStackFacts
from tests.support.strict_json import assert_strict_json

ALL_BYTES = bytes(range(256)).decode("utf-8", "surrogateescape")
HOSTILE = "\x1b]0;pwned\x07$(id)\n" + ALL_BYTES + "\ud800"  # and one surrogate no decoder makes


def _fill_strings(obj, value):
    """Set every ``str``-typed dataclass field of ``obj`` to ``value``."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        hint = hints.get(f.name)
        if hint is str or hint == (str | None):
            setattr(obj, f.name, value)
    return obj


@pytest.mark.parametrize("kind", sorted(EVENT_TYPES))
def test_every_event_kind_with_every_byte_is_valid_json(kind):
    event = _fill_strings(EVENT_TYPES[kind](time=1.0, pid=7), HOSTILE)
    if isinstance(event, Exec):
        event.cmdline = [HOSTILE, ALL_BYTES]
    if isinstance(event, NetPayload):
        event.detail = {"sni": HOSTILE, HOSTILE: [HOSTILE], "n": float("nan")}
        event.data = bytes(range(256))
    line = dumps_line(event.to_json())
    assert "\n" not in line
    doc = assert_strict_json(line)
    assert doc["comm"].startswith("\x1b]0;pwned\x07$(id)\n")  # exact text, JSON-escaped only
    assert "\\xff" in doc["comm"] and "\\x80" in doc["comm"]  # bytes not UTF-8 as \xNN text
    assert doc["comm"].endswith("\\ud800")


def test_process_facts_and_gpu_snapshots_as_replay_writes_them():
    facts = _fill_strings(ProcessFacts(pid=1, start_time=1.0), HOSTILE)
    facts.cmdline = [HOSTILE]
    facts.config_files = {HOSTILE: HOSTILE}
    facts.ancestors = [Ancestor(2, HOSTILE, HOSTILE)]
    device = _fill_strings(DeviceSample(vendor="nvidia", index=0), HOSTILE)
    device.extra = {HOSTILE: HOSTILE}
    usage = _fill_strings(ProcessGpuUsage(pid=1, vendor="nvidia", device_index=0), HOSTILE)
    usage.engines = {HOSTILE: 1.0}
    snap = GpuSnapshot(
        time=1.0, source=HOSTILE, devices=[device], processes=[usage], errors=[HOSTILE]
    )
    for record in (facts.to_record(), snap.to_record()):
        assert_strict_json(dumps_line(record))
    view = GpuView(
        1.0,
        [snap],
        {1: ProcessLabel(name=HOSTILE, exe=HOSTILE, user=HOSTILE, container=HOSTILE)},
        [HOSTILE],
    )
    assert_strict_json(dumps_line(view_to_json(view)))


def _finding() -> Finding:
    return Finding(
        kind="process",
        rule_id="r",
        rule_name=HOSTILE,
        rule_description=HOSTILE,
        score=80,
        verdict="malicious",
        explanation=f"pid 4 {HOSTILE}",
        evidence=[Evidence("r", "comm", HOSTILE, 40, "high", ("T1036",), HOSTILE)],
        categories=["process"],
        techniques=[("T1036", "Masquerading")],
        process=ProcessInfo(
            pid=4,
            name=HOSTILE,
            executable=HOSTILE,
            command_line=[HOSTILE, ALL_BYTES],
            start_time=1.0,
            ppid=1,
            parent_name=HOSTILE,
            parent_executable=HOSTILE,
            user_id=0,
            user_name=HOSTILE,
            container_id=HOSTILE,
        ),
    )


@pytest.mark.parametrize("fmt", sorted(SCAN_FORMATS))
def test_scan_documents_one_rule_no_double_escaping(fmt):
    report = ScanReport(
        started=1.0,
        finished=2.0,
        findings=[_finding()],
        gpu_stack=GpuStackFacts(taint=0),
        processes_scanned=1,
        suspicious_threshold=40,
        malicious_threshold=75,
        limitations=[HOSTILE],
        notes=[HOSTILE],
    )
    doc = assert_strict_json(dumps_document(scan_document(report, fmt)))
    finding = doc["findings"][0]
    # the sentence holds the exact text once: ESC is one character, not the four of "\x1b"
    assert finding["message"].startswith("pid 4 \x1b]0;pwned\x07$(id)\n")
    assert "\\x1b" not in finding["message"] and "\\xff" in finding["message"]
    assert doc["summary"]["could_not_see"][0].startswith("\x1b]0;pwned")


def test_one_rule_for_direct_renderers_too():
    for doc in (
        finding_to_ecs(_finding(), 1.0, {"hostname": HOSTILE}),
        finding_to_ocsf(_finding(), 1.0, HOSTILE),
    ):
        assert_strict_json(dumps_line(doc))
        assert_strict_json(dumps_document(doc))
