"""The agent's SIEM log: ECS/OCSF/CEF shapes, hostile names, and every destination's failure modes."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuguard.escape import visible_text
from gpuguard.events.agent_events import ActionOutcome, AgentLifecycle
from gpuguard.outputs.finding import Finding
from gpuguard.outputs.log_writer import open_log
from gpuguard.outputs.records import FORMATS
from tests.support.cef import parse_cef
from tests.support.findings import (
    HOST,
    HOSTILE,
    hostile_finding,
    hostile_records,
)
from tests.support.json_shapes import ECS_FINDING_SHAPE, shape_errors
from tests.support.records import render_record

REPO = Path(__file__).resolve().parent.parent


# -- shapes ----------------------------------------------------------------------------


def test_ecs_finding_from_a_real_replay_has_every_field_a_siem_needs(miner_finding):
    doc = json.loads(render_record(miner_finding, "ecs", HOST))
    assert shape_errors(doc, ECS_FINDING_SHAPE) == []
    assert doc["event"]["kind"] == "alert" and doc["event"]["action"] == "process-malicious"
    assert doc["event"]["dataset"] == "gpuguard.agent" and doc["event"]["severity"] == 99
    assert doc["event"]["risk_score"] == 100 and "network" in doc["event"]["category"]
    assert doc["rule"]["id"] == "net-pool-protocol" and doc["rule"]["ruleset"] == "gpuguard"
    p = doc["process"]
    assert (
        p["pid"] == 4242 and p["name"] == "xmrig" and re.fullmatch(r"[0-9a-f]{32}", p["entity_id"])
    )
    assert p["parent"]["pid"] > 0 and p["start"].endswith("Z")
    assert doc["user"]["name"] == "bob" and doc["host"]["hostname"] == "gpu-node-7"
    assert doc["destination"] == {"address": "141.94.96.144", "ip": "141.94.96.144", "port": 3333}
    assert (
        doc["threat"]["framework"] == "MITRE ATT&CK"
        and doc["threat"]["technique"]["id"][0] == "T1496"
    )
    g = doc["gpuguard"]
    assert g["score"] == 100 and g["verdict"] == "malicious" and len(g["evidence"]) >= 10
    assert g["gpu"]["device_paths"] == ["/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidiactl"]
    assert g["gpu"]["util_mean"] > 90 and g["gpu"]["ioctl_total"] == 766
    # the same process in a later record has the same entity id
    again = json.loads(render_record(miner_finding, "ecs", HOST))
    assert again["process"]["entity_id"] == p["entity_id"]


def test_ecs_container_and_orchestrator_when_known():
    doc = json.loads(render_record(hostile_finding(), "ecs", HOST))
    assert doc["container"] == {"id": "c" * 64}
    assert doc["orchestrator"] == {
        "type": "kubernetes",
        "resource": {"type": "pod", "id": "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"},
    }


def test_ecs_kind_is_event_below_the_threshold():
    assert (
        json.loads(render_record(hostile_finding(10, "clean"), "ecs", HOST))["event"]["kind"]
        == "event"
    )
    assert (
        json.loads(render_record(hostile_finding(45, "suspicious"), "ecs", HOST))["event"]["kind"]
        == "alert"
    )


def test_ecs_actions_and_lifecycle():
    finding, action, fault = (json.loads(render_record(r, "ecs", HOST)) for r in hostile_records())
    assert action["event"] == {
        **action["event"],
        "kind": "event",
        "action": "kill",
        "outcome": "success",
        "category": ["process"],
        "type": ["end"],
    }
    assert action["process"]["pid"] == 66 and action["gpuguard"]["status"] == "done"
    assert (
        action["process"]["entity_id"] == finding["process"]["entity_id"]
    )  # joins the finding it answers
    assert fault["event"]["action"] == "fault" and fault["event"]["outcome"] == "failure"
    assert fault["log"]["level"] == "error" and fault["gpuguard"]["kind"] == "lifecycle"
    assert (
        fault["event"]["kind"] == "event" and finding["event"]["kind"] == "alert"
    )  # only findings page
    killed = json.loads(
        render_record(ActionOutcome(time=1.0, action="kill", status="failed", pid=7), "ecs", HOST)
    )
    assert killed["event"]["outcome"] == "failure" and killed["process"]["pid"] == 7
    egress = json.loads(
        render_record(
            ActionOutcome(
                time=1.0,
                action="block-egress",
                status="failed",
                detail={"addresses": ["198.51.100.7"]},
            ),
            "ecs",
            HOST,
        )
    )
    assert egress["event"]["category"] == ["network"] and egress["event"]["outcome"] == "failure"
    assert egress["destination"] == {"address": "198.51.100.7"}


def test_ocsf_finding_from_a_real_replay_names_the_pool_endpoint(miner_finding):
    event = json.loads(render_record(miner_finding, "ocsf", HOST))
    network = [e for e in event["evidences"] if e["data"]["rule_id"].startswith("net-")]
    assert network and all(
        e["dst_endpoint"] == {"ip": "141.94.96.144", "port": 3333} for e in network
    )
    ecs = json.loads(render_record(miner_finding, "ecs", HOST))
    assert event["evidences"][0]["process"]["uid"] == ecs["process"]["entity_id"]


def test_ocsf_classes():
    finding, action, fault = (json.loads(render_record(r, "ocsf", HOST)) for r in hostile_records())
    assert (finding["class_uid"], finding["category_uid"], finding["type_uid"]) == (2004, 2, 200401)
    assert (
        action["class_uid"],
        action["category_uid"],
        action["activity_id"],
        action["type_uid"],
    ) == (7003, 7, 2, 700302)
    assert action["status_id"] == 1 and action["process"]["pid"] == 66
    assert (
        fault["class_uid"],
        fault["category_uid"],
        fault["activity_id"],
        fault["status_id"],
    ) == (6002, 6, 99, 2)
    start = json.loads(render_record(AgentLifecycle(time=5.0, action="start"), "ocsf", HOST))
    assert (start["activity_id"], start["type_uid"], start["time"]) == (3, 600203, 5000)
    block = json.loads(
        render_record(ActionOutcome(time=1.0, action="block-egress", status="done"), "ocsf", HOST)
    )
    assert (block["class_uid"], block["activity_name"]) == (7004, "Isolate")


def test_cef_header_and_extension(miner_finding):
    made = dataclasses.replace(miner_finding, created=1_700_000_000.0)
    header, ext = parse_cef(render_record(made, "cef", HOST))
    assert header == [
        "CEF:0",
        "gpuguard",
        "gpuguard",
        header[3],
        "net-pool-protocol",
        "mining pool protocol on the wire",
        "10",
    ]
    assert ext["rt"] == "1700000000000" and ext["dvchost"] == "gpu-node-7"
    assert (ext["sproc"], ext["spid"], ext["suser"]) == ("xmrig", "4242", "bob")
    assert (ext["dst"], ext["dpt"]) == ("141.94.96.144", "3333")
    assert ext["cs1Label"] == "verdict" and ext["cs1"] == "malicious" and ext["cn1"] == "100"
    assert "--donate-level=1" in ext["cs5"]  # '=' inside a value survives the escaping


# -- hostile names ------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_hostile_name_cannot_forge_a_line_in_any_format(fmt):
    for record in hostile_records():
        line = render_record(record, fmt, HOST)
        data = line.encode("utf-8")  # valid UTF-8 (no lone surrogates)
        assert len(line.splitlines()) == 1 and b"\n" not in data and b"\r" not in data
        assert not re.search(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]", line), ascii(line)
        if fmt == "cef":
            header, ext = parse_cef(line)  # "CEF:0|forged..." stays inside a value on the same line
            assert (
                len(header) == 7
                and header[1] == "gpuguard"
                and header[4] in ("miner-binary-name", "action-kill", "agent-fault")
            )
            text = ext.get("sproc") or ext.get("msg")
            # decodes to the exact name, newlines and \\ included; what CEF cannot carry (ESC,
            # the invalid byte, U+2028) is the visible text the JSON formats write too
            assert visible_text(HOSTILE, keep="\n\r") in text
            assert "\\xff" in text and "c\\d" in text and "\n" in text
        else:
            doc = json.loads(line)
            names = [
                (doc.get("process") or {}).get("name"),
                ((doc.get("evidences") or [{}])[0].get("process") or {}).get("name"),
            ]  # OCSF findings
            if isinstance(record, (Finding, ActionOutcome)):
                # structured fields keep the exact name; only the undecodable byte is shown as \xff
                assert HOSTILE.replace("\udcff", "\\xff") in names
            # one JSON rule (outputs/jsonl.py): the sentence carries the exact text, escaped once by
            # JSON itself, so the line above holds no raw control byte and the decoded message is exact
            assert HOSTILE.replace("\udcff", "\\xff") in doc["message"]


# -- destinations ---------------------------------------------------------------------------


def test_file_rotation_keeps_the_count_and_whole_lines(tmp_path):
    path = tmp_path / "agent.log"
    writer = open_log(str(path), "ecs", queue_size=0, max_bytes=4096, keep=2, host=HOST)
    records = [
        AgentLifecycle(time=float(i), action="drops", message=f"record {i}") for i in range(100)
    ]
    for record in records:
        assert writer.write(record)
    writer.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["agent.log", "agent.log.1", "agent.log.2"]
    kept = []
    for name in ("agent.log.2", "agent.log.1", "agent.log"):
        data = (tmp_path / name).read_text()
        assert len(data.encode()) <= 4096 and data.endswith("\n")
        kept += [json.loads(line)["message"] for line in data.splitlines()]
    assert kept == [f"record {i}" for i in range(100 - len(kept), 100)]  # newest kept, in order
    assert (writer.written, writer.errors, writer.dropped) == (100, 0, 0)
    assert oct(path.stat().st_mode & 0o777) == "0o640"


def test_a_file_renamed_away_by_logrotate_is_reopened(tmp_path):
    path = tmp_path / "agent.log"
    writer = open_log(str(path), "cef", queue_size=0, host=HOST)
    writer.write(AgentLifecycle(time=1.0, action="start"))
    os.rename(path, tmp_path / "agent.log.1")
    writer.write(AgentLifecycle(time=2.0, action="stop"))
    writer.close()
    assert "agent-start" in (tmp_path / "agent.log.1").read_text()
    assert "agent-stop" in path.read_text() and "agent-start" not in path.read_text()


@pytest.mark.root
@pytest.mark.self_contained
def test_a_full_disk_is_a_reported_fault_and_recovers(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16k", f"gg-full-{os.getpid()}", str(mnt)], check=True
    )
    try:
        writer = open_log(str(mnt / "agent.log"), "ecs", queue_size=0, max_bytes=1 << 20, host=HOST)
        for _i in range(200):  # ~60 KiB into 16 KiB: ENOSPC, never an exception
            writer.write(hostile_finding())
        assert writer.errors > 0 and writer.written > 0 and writer.written + writer.errors == 200
        (fault,) = writer.take_faults()  # one fault per run of failures, not one per record
        assert fault.action == "fault" and "No space left on device" in fault.message
        assert fault.detail["destination"] == str(mnt / "agent.log")
        os.truncate(mnt / "agent.log", 0)  # space again: the next record goes through
        assert writer.write(AgentLifecycle(time=1.0, action="start"))
        (recovered,) = writer.take_faults()
        assert recovered.detail.get("recovered") is True
        assert (
            json.loads((mnt / "agent.log").read_text().splitlines()[-1])["event"]["action"]
            == "start"
        )
        writer.close()
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


CLOSED_STDOUT_CHILD = """
import sys, time
from gpuguard.escape import visible_text
from gpuguard.events.agent_events import AgentLifecycle
from gpuguard.outputs.log_writer import open_log
sys.stdin.readline()                 # the parent closes its end of our stdout first
writer = open_log("-", "ecs")
for i in range(50):
    writer.write(AgentLifecycle(time=float(i), action="drops"))
writer.flush()
writer.close()
faults = writer.take_faults()
print(writer.written, writer.errors, len(faults), faults[0].message if faults else "", file=sys.stderr)
"""


def test_a_closed_stdout_pipe_is_a_reported_fault(tmp_path):
    child = subprocess.Popen(
        [sys.executable, "-c", CLOSED_STDOUT_CHILD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
        text=True,
    )
    child.stdout.close()  # the reader (e.g. `| head`) went away
    child.stdin.write("go\n")
    child.stdin.close()
    err = child.stderr.read()
    assert child.wait(20) == 0, err
    written, errors, faults, message = err.split(" ", 3)
    assert (written, errors, faults) == ("0", "50", "1"), err
    assert "Broken pipe" in message and "Traceback" not in err


def test_a_slow_destination_drops_and_counts_without_blocking(tmp_path):
    fifo = tmp_path / "slow"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader that does not read: writes stall
    writer = open_log(str(fifo), "ecs", queue_size=16, host=HOST)
    try:
        started = time.monotonic()
        for _ in range(500):  # ~300 KiB into a 64 KiB pipe nobody reads
            writer.write(hostile_finding())
        elapsed = time.monotonic() - started
        assert writer.dropped > 0 and writer.dropped + writer.queue_depth + writer.written <= 500
        assert elapsed < 20.0  # the caller never waited on the pipe (it would hang)
    finally:
        drained = 0
        deadline = time.monotonic() + 10
        while (writer.queue_depth or not writer.flush(0.05)) and time.monotonic() < deadline:
            try:
                drained += len(os.read(reader, 1 << 16))
            except BlockingIOError:
                time.sleep(0.01)
        writer.close()
        os.close(reader)
    assert drained > 0 and writer.errors == 0


def test_syslog_over_a_unix_socket_and_udp(tmp_path):
    import socket

    path = str(tmp_path / "log.sock")
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    unix.bind(path)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    try:
        w1 = open_log(f"syslog:unix:{path}", "cef", queue_size=0, facility="local4", host=HOST)
        w1.write(hostile_finding())
        w2 = open_log(
            f"syslog:udp:127.0.0.1:{udp.getsockname()[1]}",
            "ecs",
            queue_size=0,
            syslog_format="rfc3164",
            host=HOST,
        )
        w2.write(AgentLifecycle(time=1.0, action="start", message="up"))
        m1 = unix.recv(65536).decode()
        m2 = udp.recv(65536).decode()
        w1.close()
        w2.close()
    finally:
        unix.close()
        udp.close()
    # <local4 * 8 + crit> for a malicious finding; RFC 5424 header then the CEF line
    assert re.match(r"<162>1 \d{4}-\d\d-\d\dT\S+Z \S+ gpuguard \d+ - - CEF:0\|gpuguard\|", m1), m1
    assert "\n" not in m1
    # RFC 3164: <daemon * 8 + info>Mmm dd hh:mm:ss host gpuguard[pid]: JSON
    match = re.match(r"<30>[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \S+ gpuguard\[\d+\]: (\{.*\})$", m2)
    assert match and json.loads(match.group(1))["event"]["action"] == "start", m2


def test_bad_destinations_and_formats_are_refused_up_front():
    for bad in ("syslog:udp:nohost", "syslog:tcp:h:0", "syslog:unix:relative", ""):
        with pytest.raises(ValueError, match="syslog|destination"):
            open_log(bad, "ecs")
    with pytest.raises(ValueError, match="log format"):
        open_log("-", "leef")
    with pytest.raises(ValueError, match="facility"):
        open_log("syslog", "cef", facility="nope")
