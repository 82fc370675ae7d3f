"""Log sinks under faults: a full disk, a UDP collector that is not there, a TCP collector that goes away.

Every case checks the promise a SIEM relies on: what reached the destination parses line
by line, and the writer's counts are exact (produced = written + spooled + dropped + errors
+ render_errors), so nothing is lost silently.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time

import pytest

from gpuguard.agent.config import AgentConfig
from gpuguard.agent.counters import AgentCounters
from gpuguard.agent.telemetry import AgentTelemetry
from gpuguard.events.agent_events import AgentLifecycle
from gpuguard.outputs.log_writer import open_log
from tests.support.rsyslog import Rsyslogd, free_ports
from tests.test_agent_logs import HOST, hostile_finding


def _balanced(writer) -> bool:
    return writer.produced == (
        writer.written + writer.spooled + writer.dropped + writer.errors + writer.render_errors
    )


def _dead_port(kind: int = socket.SOCK_DGRAM) -> int:
    """A loopback port nothing listens on (bound once, then let go)."""
    with socket.socket(socket.AF_INET, kind) as hold:
        hold.bind(("127.0.0.1", 0))
        return hold.getsockname()[1]


def _records(n: int, start: int = 0) -> list[AgentLifecycle]:
    return [
        AgentLifecycle(time=1000.0 + i, action="drops", message=f"record-{i:05d}")
        for i in range(start, start + n)
    ]


@pytest.fixture
def small_disk(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16k", f"gg-enospc-{os.getpid()}", str(mnt)],
        check=True,
    )
    yield mnt
    subprocess.run(["umount", str(mnt)], check=True)


@pytest.mark.root
@pytest.mark.self_contained
def test_a_full_disk_leaves_whole_records_and_exact_counts(small_disk):
    path = small_disk / "agent.log"
    writer = open_log(str(path), "ecs", queue_size=0, max_bytes=1 << 20, host=HOST)
    for _ in range(200):  # ~60 KiB into 16 KiB: many records fail, some of them half-written
        writer.write(hostile_finding())
    assert writer.errors > 0 and writer.written > 0 and _balanced(writer)
    text = path.read_bytes()
    assert text.endswith(b"\n"), "the file must end on a record boundary"
    lines = text.decode().splitlines()
    assert len(lines) == writer.written  # every record counted as written is there, whole
    for line in lines:
        json.loads(line)
    os.truncate(path, 0)  # space again
    for record in _records(3):
        assert writer.write(record)
    writer.close()
    lines = path.read_text().splitlines()
    assert [json.loads(x)["message"] for x in lines] == [
        "record-00000",
        "record-00001",
        "record-00002",
    ]
    assert _balanced(writer)


@pytest.mark.root
@pytest.mark.self_contained
def test_a_fragment_left_in_the_file_is_never_glued_to_the_next_record(tmp_path):
    path = tmp_path / "agent.log"
    path.write_bytes(b'{"a crash mid-write": tru')  # an earlier run died inside a record
    writer = open_log(str(path), "ecs", queue_size=0, host=HOST)
    writer.write(_records(1)[0])
    writer.close()
    fragment, record = path.read_text().splitlines()
    assert fragment.startswith('{"a crash') and json.loads(record)["message"] == "record-00000"


def test_udp_with_nothing_listening_counts_every_record_lost_and_reports_once():
    port = _dead_port()
    writer = open_log(f"syslog:udp:127.0.0.1:{port}", "cef", queue_size=0, host=HOST)
    for record in _records(300):
        writer.write(record)
    assert (writer.written, writer.errors) == (0, 300)
    assert _balanced(writer)
    (fault,) = writer.take_faults()
    assert fault.action == "fault" and not fault.detail.get("recovered")
    writer.close()


def test_a_failing_sink_never_carries_its_own_failure_notes(tmp_path):
    """The agent's view: faults go to stderr, rate-limited; none is written to the failed log."""
    port = _dead_port()
    config = AgentConfig(log_path=f"syslog:udp:127.0.0.1:{port}", output_queue=1000)
    counters = AgentCounters()
    lines: list[str] = []
    telemetry = AgentTelemetry(config, counters, lines.append)
    telemetry.open_log()
    writer = telemetry.writer
    for _round in range(20):  # the agent's loop: records, then sync_log
        for record in _records(10):
            telemetry.write(record)
        assert writer.flush(5)
        telemetry.sync_log()
    assert writer.flush(5)
    assert writer.produced == 200  # the faults were not fed back into the failing sink
    assert len(lines) == 1, lines  # one line on stderr, however long the outage
    assert counters.log_faults == 1 and counters.output_errors == 200
    writer.close()


def test_a_udp_collector_that_comes_back_gets_one_recovery_note_naming_the_gap():
    port = _dead_port()
    writer = open_log(f"syslog:udp:127.0.0.1:{port}", "ecs", queue_size=0, host=HOST)
    for record in _records(5):
        writer.write(record)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as collector:
        collector.bind(("127.0.0.1", port))
        collector.settimeout(5)
        for record in _records(3, start=5):
            writer.write(record)
        got = [collector.recv(65536).decode() for _ in range(3)]
    assert [g.split("record-")[1][:5] for g in got] == ["00005", "00006", "00007"]
    failed, recovered = writer.take_faults()
    assert recovered.detail == {**recovered.detail, "recovered": True, "lost": 5}
    assert (writer.written, writer.errors) == (3, 5) and _balanced(writer)
    writer.close()


@pytest.mark.root
@pytest.mark.self_contained
def test_a_tcp_collector_away_gets_the_spooled_records_in_order_when_back(tmp_path):
    (tmp_path / "rsyslog").mkdir()
    daemon = Rsyslogd(tmp_path / "rsyslog", *free_ports())
    daemon.start()
    spool = tmp_path / "spool"
    writer = open_log(
        f"syslog:tcp:127.0.0.1:{daemon.tcp}",
        "ecs",
        host=HOST,
        spool_dir=str(spool),
        spool_max_bytes=1 << 20,
    )
    try:
        for record in _records(10):
            writer.write(record)
        assert writer.flush(5)
        daemon.lines(10)
        daemon.stop()  # the collector goes away
        for record in _records(40, start=10):
            writer.write(record)
        assert writer.flush(5)
        assert writer.spooled == 40 and writer.errors == 0 and _balanced(writer)
        daemon.start()  # back on the same port: the spool is sent in order, then new records
        for record in _records(5, start=50):
            writer.write(record)
        deadline = time.monotonic() + 15
        while writer.spooled and time.monotonic() < deadline:
            time.sleep(0.1)
        assert writer.flush(5)
        received = daemon.lines(55)
        numbers = [int(line.split("record-")[1][:5]) for line in received]
        assert numbers == list(range(55))  # all of them, once each, in order
        assert (writer.written, writer.spooled, writer.errors) == (55, 0, 0) and _balanced(writer)
        assert not os.path.exists(spool) or not os.listdir(spool)
        faults = writer.take_faults()
        assert [bool(f.detail.get("recovered")) for f in faults] == [False, True]
    finally:
        writer.close()
        daemon.stop()


def test_a_full_spool_counts_what_overflowed(tmp_path):
    port = _dead_port(socket.SOCK_STREAM)  # every connect is refused
    writer = open_log(
        f"syslog:tcp:127.0.0.1:{port}",
        "ecs",
        queue_size=0,
        host=HOST,
        spool_dir=str(tmp_path / "spool"),
        spool_max_bytes=4096,
    )
    for record in _records(100):
        writer.write(record)
    assert 0 < writer.spooled < 100 and writer.errors == 100 - writer.spooled
    assert _balanced(writer)
    spooled = (tmp_path / "spool").glob("*.spool")
    (spool_file,) = list(spooled)
    assert spool_file.stat().st_size <= 4096 and spool_file.read_bytes().endswith(b"\n")
    writer.close()
