"""A loopback port for a test's server, or one nothing listens on."""

from __future__ import annotations

import os
import socket


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    """A loopback port of ``kind`` (TCP by default) that was free a moment ago."""
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def quiet_port(kind: int = socket.SOCK_DGRAM) -> int:
    """A loopback port of ``kind`` nothing listens on, and that the kernel gives no one asking for
    any port (below ``ip_local_port_range``): a :func:`free_port` is back in that pool at once,
    and on a busy host another test's server may bind it while a test relies on its silence.
    Each process starts its search at its own offset, so two workers seldom meet."""
    try:
        low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    start = low - 1 - os.getpid() % 4000
    for port in range(start, 1024, -1):
        with socket.socket(socket.AF_INET, kind) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    return free_port(kind)
