"""A real rsyslogd (Debian's) on loopback with a temporary config: start, stop, start again."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from tests.support.processes import terminate

CONFIG = """\
global(workDirectory="{tmp}" maxMessageSize="{max_message_size}")
module(load="imudp")
module(load="imtcp")
input(type="imudp" address="127.0.0.1" port="{udp}")
input(type="imtcp" address="127.0.0.1" port="{tcp}")
template(name="fields" type="string" string="%syslogfacility-text%|%syslogseverity-text%|%programname%|%msg%\\n")
*.* action(type="omfile" file="{tmp}/received.log" template="fields")
"""


def free_ports() -> tuple[int, int]:
    """A free UDP and a free TCP port on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u, socket.socket() as t:
        u.bind(("127.0.0.1", 0))
        t.bind(("127.0.0.1", 0))
        return u.getsockname()[1], t.getsockname()[1]


class Rsyslogd:
    """rsyslogd writing what it receives on ``udp``/``tcp`` to ``workdir/received.log``."""

    def __init__(self, workdir: Path, udp: int, tcp: int, max_message_size: str = "64k") -> None:
        self.binary = shutil.which("rsyslogd") or "/usr/sbin/rsyslogd"
        assert os.path.exists(self.binary), (
            "Debian's rsyslog is not installed (fix: bash packaging/setup-host.sh setup)"
        )
        self.workdir, self.udp, self.tcp = workdir, udp, tcp
        self.received = workdir / "received.log"
        self.conf = workdir / "rsyslog.conf"
        self.conf.write_text(
            CONFIG.format(tmp=workdir, udp=udp, tcp=tcp, max_message_size=max_message_size)
        )
        check = subprocess.run(
            [self.binary, "-N1", "-f", str(self.conf)], capture_output=True, text=True
        )
        assert check.returncode == 0, check.stderr
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary, "-n", "-f", str(self.conf), "-i", str(self.workdir / "rsyslogd.pid")],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # listening on TCP means both inputs are up
            assert self.proc.poll() is None, self.proc.stdout.read()
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", self.tcp)) == 0:
                    return
            time.sleep(0.05)
        raise AssertionError("rsyslogd did not start listening in 10 s")

    def stop(self) -> None:
        if self.proc is None:
            return
        terminate(self.proc)
        self.proc = None

    def lines(self, count: int, timeout: float = 10.0) -> list[str]:
        """The received lines once there are at least ``count`` of them."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.received.exists():
                lines = self.received.read_text().splitlines()
                if len(lines) >= count:
                    return lines
            time.sleep(0.05)
        got = self.received.read_text() if self.received.exists() else "nothing"
        raise AssertionError(f"rsyslog received {got!r}")
