"""Open network connections of every process, read once, as Connect events.

Data flow: one ``psutil.net_connections(kind="inet")`` call (a single pass over
/proc/net/{tcp,tcp6,udp,udp6} plus the fd tables) -> connections with a remote
address, grouped by pid -> :class:`~gpuguard.events.model.Connect` events, the
same events the sensor emits at connect(2), so pool-port, pool-CIDR and proxy
rules apply unchanged.

Without root, sockets of other users' processes are listed by the kernel but
cannot be mapped to a pid; they are counted so the scan can say so.  Sockets
that no process owns (TIME_WAIT, or any pid-less socket when running as root,
who can read every fd table) are not a blind spot: they are counted apart as
``ownerless`` and never reported as unmapped.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

import psutil

from gpuguard.events.model import Connect

_FAMILY = {socket.AF_INET: "ipv4", socket.AF_INET6: "ipv6"}
# A socket in TIME_WAIT has been closed by its process: the kernel alone holds it.
_NO_OWNER_STATUSES = frozenset({psutil.CONN_TIME_WAIT})


@dataclass(slots=True, frozen=True)
class RemoteConnection:
    """One socket of one process with a remote end."""

    pid: int
    fd: int
    family: str  # "ipv4" | "ipv6"
    protocol: str  # "tcp" | "udp"
    local_address: str
    local_port: int
    remote_address: str
    remote_port: int
    status: str  # psutil status, e.g. "ESTABLISHED", "SYN_SENT", "NONE" (udp)


@dataclass(slots=True)
class ConnectionTable:
    by_pid: dict[int, list[RemoteConnection]] = field(default_factory=dict)
    unattributed: int = 0  # remote connections whose owner pid could not be read (not root)
    ownerless: int = 0  # remote connections no process owns (TIME_WAIT; pid-less as root)
    unavailable: str | None = None  # why no table could be read at all


def _inet_connections(socket_owners: dict[str, list[tuple[int, int]]] | None) -> list:
    """``psutil.net_connections(kind="inet")``; with ``socket_owners`` (inode -> [(pid, fd)],
    :meth:`gpuguard.sources.proc.fd_table.FdTables.socket_owners`) psutil's own /proc/net parser maps
    the sockets through them instead of walking every fd table again."""
    if socket_owners is not None:
        try:
            from psutil._pslinux import NetConnections
        except ImportError:  # another psutil layout: its public call walks the fd tables itself
            return psutil.net_connections(kind="inet")
        if hasattr(NetConnections, "get_all_inodes"):

            class _Known(NetConnections):
                def get_all_inodes(self):
                    return socket_owners

            return _Known().retrieve("inet")
    return psutil.net_connections(kind="inet")


def read_connection_table(
    as_root: bool | None = None, socket_owners: dict[str, list[tuple[int, int]]] | None = None
) -> ConnectionTable:
    """Every inet socket with a remote address, by owning pid (``socket_owners``: the fd tables
    already read, see :func:`_inet_connections`)."""
    as_root = os.geteuid() == 0 if as_root is None else as_root
    table = ConnectionTable()
    try:
        conns = _inet_connections(socket_owners)
    except (psutil.AccessDenied, OSError) as exc:
        table.unavailable = f"could not list network connections ({exc.__class__.__name__})"
        return table
    for conn in conns:
        if not conn.raddr:
            continue
        if conn.pid is None:
            if as_root or conn.status in _NO_OWNER_STATUSES:
                table.ownerless += 1
            else:
                table.unattributed += 1
            continue
        remote = RemoteConnection(
            pid=conn.pid,
            fd=conn.fd,
            family=_FAMILY.get(conn.family, "unknown"),
            protocol="tcp" if conn.type == socket.SOCK_STREAM else "udp",
            local_address=conn.laddr.ip if conn.laddr else "",
            local_port=conn.laddr.port if conn.laddr else 0,
            remote_address=conn.raddr.ip,
            remote_port=conn.raddr.port,
            status=str(conn.status),
        )
        table.by_pid.setdefault(conn.pid, []).append(remote)
    return table


def connect_event(conn: RemoteConnection, time: float, uid: int = 0, comm: str = "") -> Connect:
    """The :class:`Connect` the sensor would have reported when the socket connected."""
    return Connect(
        time=time,
        pid=conn.pid,
        tid=conn.pid,
        uid=uid,
        comm=comm,
        family=conn.family,
        address=conn.remote_address,
        port=conn.remote_port,
        fd=conn.fd,
        result=0,
    )
