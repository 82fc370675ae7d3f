"""Network connections for the scan: sockets no process owns are not a blind spot."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from gpuguard.sources.net.connections import read_connection_table
from tests.support.unprivileged import as_nobody

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _time_wait_pair() -> tuple[tuple[str, int], tuple[str, int]]:
    """A loopback connection whose client closed first: the kernel keeps it in TIME_WAIT, owned
    by no one.  Its (client, server) addresses: a busy host may hold another TIME_WAIT socket on
    the same ephemeral port towards another server."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    client = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()
    local, remote = client.getsockname(), server.getsockname()
    client.close()  # the active closer goes to TIME_WAIT
    time.sleep(0.05)
    accepted.close()
    server.close()
    return local, remote


@pytest.mark.root
@pytest.mark.self_contained
def test_time_wait_sockets_are_ownerless_not_unmapped_as_root():
    local, _ = _time_wait_pair()
    table = read_connection_table()
    assert table.unattributed == 0
    assert table.ownerless >= 1
    assert all(c.local_port != local[1] for conns in table.by_pid.values() for c in conns)


@pytest.mark.root
@pytest.mark.self_contained
def test_time_wait_is_not_a_blind_spot_without_root_either():
    local, remote = _time_wait_pair()
    # As nobody, the real listing of this host's sockets, narrowed to ours, by both ends (other
    # sockets come and go on a busy host), classified by gpuguard's table.
    ours = f"c.laddr and c.laddr.port == {local[1]} and c.raddr and c.raddr.port == {remote[1]}"
    code = (
        "import json, gpuguard.sources.net.connections as n; "
        "real = n._inet_connections; "
        f"n._inet_connections = lambda owners: [c for c in real(owners) if {ours}]; "
        "t = n.read_connection_table(); "
        f"tw = n._inet_connections(None); "
        "print(json.dumps([t.unattributed, t.ownerless, [str(c.status) for c in tw], [c.pid for c in tw]]))"
    )
    out = subprocess.run(
        [*as_nobody(), sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": REPO},
    )
    assert out.returncode == 0, out.stderr
    unattributed, ownerless, statuses, pids = json.loads(out.stdout)
    assert statuses == ["TIME_WAIT"] and pids == [None]  # nobody sees it, with no owner
    # Not a blind spot: counted as ownerless, not as a connection whose owner could not be read.
    assert (unattributed, ownerless) == (0, 1)
