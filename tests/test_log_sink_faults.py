"""Log sinks under faults: a full disk, a UDP collector that is not there, a TCP collector that goes away.

Every case checks the promise a SIEM relies on: what reached the destination parses line
by line, and the writer's counts are exact (produced = written + spooled + dropped + errors
+ render_errors), so nothing is lost silently.
"""

from __future__ import annotations

import json
import os
import socket
import time

import pytest

from gpuguard.agent.config import AgentConfig
from gpuguard.agent.counters import AgentCounters
from gpuguard.agent.telemetry import AgentTelemetry
from gpuguard.events.agent_events import AgentLifecycle
from gpuguard.outputs.log_writer import open_log
from tests.support.findings import HOST, hostile_finding
from tests.support.ports import quiet_port
from tests.support.records import render_record
from tests.support.rsyslog import Rsyslogd, free_ports
from tests.support.tmpfs import fill, small_tmpfs


def _balanced(writer) -> bool:
    return writer.produced == (
        writer.written + writer.spooled + writer.dropped + writer.errors + writer.render_errors
    )


def _records(n: int, start: int = 0) -> list[AgentLifecycle]:
    return [
        AgentLifecycle(time=1000.0 + i, action="drops", message=f"record-{i:05d}")
        for i in range(start, start + n)
    ]


@pytest.fixture
def small_disk(tmp_path):
    with small_tmpfs(tmp_path / "small", "16k", "gg-enospc") as mnt:
        yield mnt


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
    lines = [json.loads(line) for line in text.decode().splitlines()]  # every one whole
    notes = [x for x in lines if x["event"]["action"] == "fault"]
    # every record counted as written is there; a gap note that fitted (a full disk's last
    # page) names the records lost before it, and the rest wait for the next note
    assert len(lines) - len(notes) == writer.written and len(notes) == writer.gap_notes
    marked = sum(x["gpuguard"]["detail"]["lost"] for x in notes)
    assert marked + writer.stats()["unmarked"] == writer.errors
    os.truncate(path, 0)  # space again
    for record in _records(3):
        assert writer.write(record)
    writer.close()
    gap, *lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [x["message"] for x in lines] == ["record-00000", "record-00001", "record-00002"]
    # the first line the disk took again names the rest of the gap: every record not written
    # is in a note
    assert gap["event"]["action"] == "fault" and gap["gpuguard"]["detail"]["recovered"] is True
    assert marked + gap["gpuguard"]["detail"]["lost"] == writer.errors
    assert writer.stats()["unmarked"] == 0
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
    port = quiet_port(socket.SOCK_DGRAM)
    writer = open_log(f"syslog:udp:127.0.0.1:{port}", "cef", queue_size=0, host=HOST)
    for record in _records(300):
        writer.write(record)
    assert (writer.written, writer.errors) == (0, 300)
    assert _balanced(writer)
    (fault,) = writer.take_faults()
    assert fault.action == "fault" and not fault.detail.get("recovered")
    writer.close()


class RemoteRefusals:
    """A connected UDP socket to a collector on another host, as the kernel reports it: a datagram
    the collector's host refuses (ICMP port unreachable) fails the *next* send with
    ECONNREFUSED (which clears it), and SO_ERROR reads 0 before the refusal arrives.  The only
    fake here stands for a remote host's timing, which loopback cannot show (and this kernel has
    no netem qdisc to delay it)."""

    def __init__(self) -> None:
        self.listening = False
        self.delivered: list[bytes] = []
        self._refusal_pending = False

    def send(self, data: bytes) -> int:
        if self._refusal_pending:
            self._refusal_pending = False
            raise ConnectionRefusedError(111, "Connection refused")
        if self.listening:
            self.delivered.append(data)
        else:
            self._refusal_pending = True
        return len(data)

    def getsockopt(self, level: int, option: int) -> int:
        return 0

    def close(self) -> None:
        pass


def test_late_refusals_charge_a_gap_note_to_its_gap_not_to_the_records():
    writer = open_log("syslog:udp:192.0.2.1:514", "ecs", queue_size=0, host=HOST)
    remote = RemoteRefusals()
    writer.sink._sock = remote  # the socket the sink would have connected
    for record in _records(5):  # the collector is down
        writer.write(record)
    remote.listening = True
    for record in _records(3, start=5):
        writer.write(record)
    delivered = [json.loads(d[d.index(b"{") :]) for d in remote.delivered]
    notes = [
        d
        for d in delivered
        if d["gpuguard"]["kind"] == "lifecycle" and d["gpuguard"]["action"] == "fault"
    ]
    records = [d["message"] for d in delivered if d not in notes]
    # every record the collector refused is counted once, as lost, and named by a note that
    # reached it; the notes it refused were not taken for records
    assert records == ["record-00005", "record-00006", "record-00007"]
    assert (writer.written, writer.errors) == (3, 5)
    assert sum(n["gpuguard"]["detail"]["lost"] for n in notes) == 5
    assert writer.gap_notes == len(notes) and _balanced(writer)
    writer.close()


def test_a_failing_sink_never_carries_its_own_failure_notes(tmp_path):
    """The agent's view: faults go to stderr, rate-limited; none is written to the failed log."""
    port = quiet_port(socket.SOCK_DGRAM)
    config = AgentConfig(log_path=f"syslog:udp:127.0.0.1:{port}", output_queue=1000)
    counters = AgentCounters()
    lines: list[str] = []
    telemetry = AgentTelemetry(config, counters, lines.append)
    telemetry.open_log()
    telemetry.release()  # start-up is done: records go straight to the log
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
    port = quiet_port(socket.SOCK_DGRAM)
    writer = open_log(f"syslog:udp:127.0.0.1:{port}", "ecs", queue_size=0, host=HOST)
    for record in _records(5):
        writer.write(record)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as collector:
        collector.bind(("127.0.0.1", port))
        collector.settimeout(5)
        for record in _records(3, start=5):
            writer.write(record)
        gap, *got = [collector.recv(65536).decode() for _ in range(4)]
    assert [g.split("record-")[1][:5] for g in got] == ["00005", "00006", "00007"]
    note = json.loads(gap[gap.index("{") :])  # the first datagram taken names the gap
    assert (
        note["gpuguard"]["detail"]["recovered"] is True and note["gpuguard"]["detail"]["lost"] == 5
    )
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
    port = quiet_port(socket.SOCK_STREAM)  # every connect is refused
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


# -- gaps marked in-band --------------------------------------------------------------------


def _notes(lines: list[dict]) -> list[dict]:
    """The gap notes among parsed ECS lines (a ``fault`` lifecycle with ``recovered: true``)."""
    return [
        x
        for x in lines
        if x["event"]["action"] == "fault" and x["gpuguard"].get("detail", {}).get("recovered")
    ]


@pytest.mark.root
@pytest.mark.self_contained
def test_a_small_record_in_a_full_disks_last_page_does_not_end_the_gap(small_disk):
    """The issue's first trap: a full disk still takes a record small enough for the slack of
    the file's last page.  The gap's note comes first and is bigger, so that record is lost too
    and counted; the note is written once a record of its size really fits, naming them all."""
    path = small_disk / "agent.log"
    tiny = AgentLifecycle(time=5.0, action="drops", message="t")
    tiny_bytes = len(render_record(tiny, "ecs", HOST).encode()) + 1
    slack = tiny_bytes + 40  # room for the tiny record, not for a note naming a gap
    path.write_bytes(b'{"pad": "' + b"p" * (4096 - slack - 12) + b'"}\n')
    assert path.stat().st_size == 4096 - slack
    filler = fill(small_disk)
    writer = open_log(str(path), "ecs", queue_size=0, max_bytes=1 << 20, host=HOST)
    writer.write(hostile_finding())  # far bigger than the slack: lost
    writer.write(tiny)  # would fit, but its gap's note goes first and does not
    assert (writer.written, writer.errors, writer.gap_notes) == (0, 2, 0)
    assert path.stat().st_size == 4096 - slack  # nothing written, no fragment left
    filler.unlink()  # space again
    writer.write(tiny)
    writer.close()
    _pad, note, last = [json.loads(x) for x in path.read_text().splitlines()]
    assert len(json.dumps(note, separators=(",", ":"))) + 1 > slack  # the note never fitted
    assert note["gpuguard"]["detail"]["lost"] == 2 and last["message"] == "t"
    assert note["gpuguard"]["detail"]["lost_since"] <= note["gpuguard"]["detail"]["lost_until"]
    # written + counted in the note = produced
    assert writer.written + note["gpuguard"]["detail"]["lost"] == writer.produced == 3
    assert _balanced(writer)


def test_every_run_of_failures_is_marked_in_band_whatever_the_rate_limit_on_notes():
    """Two outages of a UDP collector within a minute: stderr hears of the first only (at most
    one fault note a minute), but the collector gets a note naming each gap before anything
    else, and the counts add up: received records + the notes' counts = produced."""
    port = quiet_port(socket.SOCK_DGRAM)
    writer = open_log(f"syslog:udp:127.0.0.1:{port}", "ecs", queue_size=0, host=HOST)
    received: list[str] = []
    for outage, (lost, kept) in enumerate(((4, 3), (6, 2))):
        for record in _records(lost, start=100 * outage):
            writer.write(record)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as collector:
            collector.bind(("127.0.0.1", port))
            collector.settimeout(5)
            for record in _records(kept, start=100 * outage + 50):
                writer.write(record)
            received += [collector.recv(65536).decode() for _ in range(kept + 1)]
    docs = [json.loads(line[line.index("{") :]) for line in received]
    assert [d["message"] if not _notes([d]) else "note" for d in docs] == [
        "note", "record-00050", "record-00051", "record-00052",
        "note", "record-00150", "record-00151",
    ]  # fmt: skip
    assert [d["gpuguard"]["detail"]["lost"] for d in _notes(docs)] == [4, 6]
    assert writer.written + 4 + 6 == writer.produced == 15 and _balanced(writer)
    faults = writer.take_faults()
    assert [bool(f.detail.get("recovered")) for f in faults] == [False, True]  # the first run's
    writer.close()


@pytest.mark.root
@pytest.mark.self_contained
def test_a_full_spool_is_marked_in_band_after_what_it_kept(tmp_path):
    """TCP syslog: the collector away, the spool full, the rest lost.  When it is back it gets
    what the spool kept, in order, then the note naming what overflowed, then the new records."""
    (tmp_path / "rsyslog").mkdir()
    daemon = Rsyslogd(tmp_path / "rsyslog", *free_ports())
    daemon.start()
    writer = open_log(
        f"syslog:tcp:127.0.0.1:{daemon.tcp}",
        "ecs",
        host=HOST,
        spool_dir=str(tmp_path / "spool"),
        spool_max_bytes=8192,
    )
    try:
        writer.write(_records(1)[0])
        assert writer.flush(5)
        daemon.lines(1)
        daemon.stop()
        for record in _records(60, start=1):
            writer.write(record)
        assert writer.flush(5)
        kept, lost = writer.spooled, writer.errors
        assert kept > 0 and lost > 0 and kept + lost == 60
        daemon.start()  # the idle writer sends the spool, then the note, without a new record
        deadline = time.monotonic() + 15
        while (writer.spooled or writer.gap_notes < 1) and time.monotonic() < deadline:
            time.sleep(0.1)
        for record in _records(3, start=61):
            writer.write(record)
        assert writer.flush(5)
        lines = daemon.lines(1 + kept + 1 + 3)
    finally:
        writer.close()
        daemon.stop()
    docs = [json.loads(line[line.index("{") :]) for line in lines]
    notes = _notes(docs)
    assert len(notes) == 1 and notes[0]["gpuguard"]["detail"]["lost"] == lost
    numbers = [int(d["message"].split("-")[1]) if d not in notes else "note" for d in docs]
    assert numbers == [*range(0, 1 + kept), "note", 61, 62, 63]
    assert writer.written + lost == writer.produced == 64 and _balanced(writer)
