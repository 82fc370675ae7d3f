"""CEF over syslog, received by a real rsyslogd (Debian's) listening on loopback with a temporary config."""

from __future__ import annotations

import json
import time

import pytest

from gpuguard.escape import visible_text
from gpuguard.events.agent_events import AgentLifecycle
from gpuguard.outputs.log_writer import open_log
from gpuguard.outputs.records import FORMATS
from tests.support.cef import parse_cef
from tests.support.findings import HOST, HOSTILE, hostile_records, huge_finding
from tests.support.rsyslog import Rsyslogd, free_ports
from tests.support.schemas import strict_cef


@pytest.fixture
def rsyslog(tmp_path):
    daemon = Rsyslogd(tmp_path, *free_ports())
    daemon.start()
    yield daemon.received, daemon.udp, daemon.tcp
    daemon.stop()


def _received(path, count: int, timeout: float = 10.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            lines = path.read_text().splitlines()
            if len(lines) >= count:
                return lines
        time.sleep(0.05)
    raise AssertionError(f"rsyslog received {path.read_text() if path.exists() else 'nothing'!r}")


def test_cef_over_udp_and_tcp_reaches_rsyslog_one_record_per_line(rsyslog, miner_finding):
    received, udp, tcp = rsyslog
    over_udp = open_log(
        f"syslog:udp:127.0.0.1:{udp}", "cef", queue_size=0, facility="local4", host=HOST
    )
    over_udp.write(miner_finding)
    over_udp.close()
    # rsyslog reads its UDP and TCP inputs in threads of their own: let the datagram land first
    _received(received, 1)
    over_tcp = open_log(
        f"syslog:tcp:127.0.0.1:{tcp}", "cef", facility="auth", syslog_format="rfc3164", host=HOST
    )
    for record in hostile_records():
        over_tcp.write(record)
    over_tcp.write(AgentLifecycle(time=2.0, action="stop", message="bye"))
    assert over_tcp.flush(5)
    over_tcp.close()
    assert (over_udp.errors, over_tcp.errors) == (0, 0)

    lines = _received(received, 5)
    assert len(lines) == 5, lines  # the hostile name forged no extra line
    fields = [line.split("|", 3) for line in lines]
    assert [f[:3] for f in fields] == [
        ["local4", "crit", "gpuguard"],
        ["auth", "crit", "gpuguard"],
        ["auth", "notice", "gpuguard"],
        ["auth", "err", "gpuguard"],
        ["auth", "info", "gpuguard"],
    ]
    parsed = [parse_cef(f[3].lstrip()) for f in fields]
    assert [p[0][4] for p in parsed] == [
        "net-pool-protocol",
        "miner-binary-name",
        "action-kill",
        "agent-fault",
        "agent-stop",
    ]
    header, ext = parsed[0]
    assert (ext["sproc"], ext["dst"], ext["dpt"], ext["cs1"]) == (
        "xmrig",
        "141.94.96.144",
        "3333",
        "malicious",
    )
    # escaped once: the decoded name is the real one (\\ and line breaks exact, ESC as text)
    assert ext["sproc"] and parsed[1][1]["sproc"] == visible_text(HOSTILE, keep="\n\r")
    assert parsed[2][1]["outcome"] == "done" and parsed[2][1]["spid"] == "66"
    assert "#033" not in received.read_text()  # rsyslog had no control character to escape


def test_huge_records_arrive_whole_at_rsyslogs_default_8k_limit(tmp_path):
    """A 100 KB command line, 10,000 arguments, a 64 KB path and 500 pieces of evidence: each
    format arrives as one message that rsyslog (maxMessageSize at its 8k default) did not cut."""
    daemon = Rsyslogd(tmp_path, *free_ports(), max_message_size="8k")
    daemon.start()
    try:
        for fmt in FORMATS:
            writer = open_log(f"syslog:tcp:127.0.0.1:{daemon.tcp}", fmt, host=HOST)
            writer.write(huge_finding())
            assert writer.flush(5) and writer.errors == 0
            writer.close()
        lines = _received(daemon.received, len(FORMATS))
    finally:
        daemon.stop()
    assert len(lines) == len(FORMATS), [line[:100] for line in lines]  # nothing split in two
    by_format = dict(zip(FORMATS, (line.split("|", 3)[3].lstrip() for line in lines), strict=True))
    ecs, ocsf, cef = by_format["ecs"], by_format["ocsf"], by_format["cef"]
    assert json.loads(ecs)["gpuguard"]["truncated"]["process"]["command_line"]["sha256"]
    assert json.loads(ocsf)["unmapped"]["gpuguard"]["truncated"]
    assert json.loads(strict_cef(cef)[1]["flexString1"])["cs5"]["original_length"] > 100_000
