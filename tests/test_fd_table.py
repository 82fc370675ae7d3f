"""One walk of every fd table: GPU holders, DRM clients and socket owners read from it see what
their own walks see."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpuguard.sources.gpu import drm_fdinfo
from gpuguard.sources.gpu.fd_holders import holders_of_pid, scan_device_holders
from gpuguard.sources.net.connections import read_connection_table
from gpuguard.sources.proc.fd_table import read_fd_tables
from gpuguard.sources.proc.hidden_pids import list_proc_pids
from tests.support.scan import pool_listener, stop

# A private /dev where renderD128 is the null device (platform.md), held on fd 7, and a TCP
# connection to the test's loopback listener: one process that all three users see.
_CHILD = (
    "mount --make-rprivate / && mount -t tmpfs tmpfs /dev && mkdir /dev/dri && "
    "mknod /dev/dri/renderD128 c 1 3 && exec 7</dev/dri/renderD128 && exec {python} -c "
    '\'import socket,sys,time; s=socket.create_connection(("127.0.0.1", {port})); '
    'print("ready", flush=True); time.sleep(60)\''
)


@pytest.mark.root
@pytest.mark.self_contained
def test_one_walk_serves_holders_drm_clients_and_socket_owners():
    with pool_listener() as pool:
        child = subprocess.Popen(
            ["unshare", "-m", "sh", "-c", _CHILD.format(python=sys.executable, port=pool.port)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert child.stdout.readline().strip() == "ready"
            tables = read_fd_tables(sorted(list_proc_pids("/proc")))
            own_walk_holders = holders_of_pid(child.pid)
            shared_holders = scan_device_holders([child.pid], tables=tables).holders
            own_walk_conns = read_connection_table().by_pid.get(child.pid)
            shared_conns = read_connection_table(socket_owners=tables.socket_owners()).by_pid.get(
                child.pid
            )
            seeded = drm_fdinfo.DrmFdinfoSampler(fd_links=tables.device_links).sample()
            # a seed that says the child holds nothing: the first sweep believes it (no re-read)
            blind = drm_fdinfo.DrmFdinfoSampler(fd_links={**tables.device_links, child.pid: []})
            blind_snap = blind.sample()
            swept_again = blind.sample()  # the seed serves the first sweep only
        finally:
            stop(child)
    assert [(h.fd, h.path, h.device_class) for h in shared_holders] == [
        (7, "/dev/dri/renderD128", "drm-render")
    ]
    assert shared_holders == own_walk_holders
    assert own_walk_conns is not None and shared_conns == own_walk_conns
    assert [(c.remote_address, c.remote_port) for c in shared_conns] == [("127.0.0.1", pool.port)]
    assert [p.device_index for p in seeded.processes if p.pid == child.pid] == [0]
    assert [p for p in blind_snap.processes if p.pid == child.pid] == []
    assert [p.device_index for p in swept_again.processes if p.pid == child.pid] == [0]


def test_a_gone_pid_is_neither_readable_nor_denied():
    child = subprocess.Popen(["true"])
    child.wait()
    tables = read_fd_tables([child.pid])
    assert tables.gone == [child.pid]
    assert child.pid not in tables.device_links and tables.unreadable == []
    assert scan_device_holders([child.pid], tables=tables).unreadable_pids == []
