"""CEF over syslog, received by a real rsyslogd (Debian's) listening on loopback with a temporary config."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time

import pytest

from gpuguard.escape import escape_text
from gpuguard.events.agent_events import AgentLifecycle
from gpuguard.outputs.log_writer import open_log
from tests.test_agent_logs import (  # noqa: F401 - hostile_finding and miner_finding are fixtures
    HOST,
    HOSTILE,
    hostile_finding,
    hostile_records,
    miner_finding,
    parse_cef,
)

CONFIG = """\
global(workDirectory="{tmp}" maxMessageSize="64k")
module(load="imudp")
module(load="imtcp")
input(type="imudp" address="127.0.0.1" port="{udp}")
input(type="imtcp" address="127.0.0.1" port="{tcp}")
template(name="fields" type="string" string="%syslogfacility-text%|%syslogseverity-text%|%programname%|%msg%\\n")
*.* action(type="omfile" file="{tmp}/received.log" template="fields")
"""


def _free_ports() -> tuple[int, int]:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u, socket.socket() as t:
        u.bind(("127.0.0.1", 0))
        t.bind(("127.0.0.1", 0))
        return u.getsockname()[1], t.getsockname()[1]


@pytest.fixture
def rsyslog(tmp_path):
    binary = shutil.which("rsyslogd") or "/usr/sbin/rsyslogd"
    assert os.path.exists(binary), (
        "Debian's rsyslog is not installed (fix: bash packaging/setup-host.sh setup)"
    )
    udp, tcp = _free_ports()
    conf = tmp_path / "rsyslog.conf"
    conf.write_text(CONFIG.format(tmp=tmp_path, udp=udp, tcp=tcp))
    check = subprocess.run([binary, "-N1", "-f", str(conf)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    proc = subprocess.Popen(
        [binary, "-n", "-f", str(conf), "-i", str(tmp_path / "rsyslogd.pid")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # listening on TCP means both inputs are up
        assert proc.poll() is None, proc.stdout.read()
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", tcp)) == 0:
                break
        time.sleep(0.05)
    yield tmp_path / "received.log", udp, tcp
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _received(path, count: int, timeout: float = 10.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            lines = path.read_text().splitlines()
            if len(lines) >= count:
                return lines
        time.sleep(0.05)
    raise AssertionError(f"rsyslog received {path.read_text() if path.exists() else 'nothing'!r}")


def test_cef_over_udp_and_tcp_reaches_rsyslog_one_record_per_line(rsyslog, miner_finding):  # noqa: F811
    received, udp, tcp = rsyslog
    over_udp = open_log(
        f"syslog:udp:127.0.0.1:{udp}", "cef", queue_size=0, facility="local4", host=HOST
    )
    over_udp.write(miner_finding)
    over_udp.close()
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
    assert ext["sproc"] and parsed[1][1]["sproc"] == escape_text(HOSTILE)
    assert parsed[2][1]["outcome"] == "done" and parsed[2][1]["spid"] == "66"
    assert "#033" not in received.read_text()  # rsyslog had no control character to escape
