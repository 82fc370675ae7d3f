"""Every process's fd table read once: the links GPU holders, DRM clients and socket owners need.

A scan used to walk every /proc/PID/fd three times (GPU device holders, the DRM sampler's
first sweep, ``psutil.net_connections``' inode map).  :func:`read_fd_tables` does one
``readlink`` per fd and keeps only what those users read: device-like targets (``/dev/...``,
``/sys/...``, classified later by :mod:`gpuguard.sources.proc.gpu_fds`) and socket inodes.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field

_DEVICE_PREFIXES = ("/dev/", "/sys/")  # the only targets a GPU class can match (proc/gpu_fds.py)
_SOCKET = "socket:["


@dataclass(slots=True)
class FdTables:
    """What the fd tables of the walked pids showed, at the time of the walk."""

    device_links: dict[int, list[tuple[int, str]]] = field(default_factory=dict)  # readable pids
    sockets: dict[int, list[tuple[str, int]]] = field(default_factory=dict)  # pid -> (inode, fd)
    unreadable: list[int] = field(default_factory=list)  # fd table not ours to read
    gone: list[int] = field(default_factory=list)  # exited before its table was read

    def socket_owners(self) -> dict[str, list[tuple[int, int]]]:
        """inode -> [(pid, fd)] as ``psutil.net_connections`` maps them: pids in ascending
        order, a later pid's entry replacing an earlier one's for a shared inode."""
        owners: dict[str, list[tuple[int, int]]] = {}
        for pid in sorted(self.sockets):
            mine: dict[str, list[tuple[int, int]]] = {}
            for inode, fd in self.sockets[pid]:
                mine.setdefault(inode, []).append((pid, fd))
            owners.update(mine)
        return owners


def read_fd_tables(pids: Iterable[int], proc_root: str = "/proc") -> FdTables:
    """One walk of the fd table of each of ``pids`` (see the module docstring)."""
    tables = FdTables()
    for pid in pids:
        try:
            links, sockets = _fd_links(f"{proc_root}/{pid}/fd")
        except FileNotFoundError:
            tables.gone.append(pid)
            continue
        except OSError:
            tables.unreadable.append(pid)
            continue
        tables.device_links[pid] = links
        if sockets:
            tables.sockets[pid] = sockets
    return tables


def _fd_links(fd_dir: str) -> tuple[list[tuple[int, str]], list[tuple[str, int]]]:
    """(fd, device or /sys target) and (socket inode, fd) of one process's fd table; raises
    FileNotFoundError for a process gone, another OSError for one not readable."""
    dir_fd = os.open(fd_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    links: list[tuple[int, str]] = []
    sockets: list[tuple[str, int]] = []
    try:
        for name in os.listdir(dir_fd):
            try:
                target = os.readlink(name, dir_fd=dir_fd)  # relative: no path walk per fd
            except OSError:
                continue
            if target.startswith(_SOCKET):
                sockets.append((target[8:-1], int(name)))
            elif target.startswith(_DEVICE_PREFIXES):
                links.append((int(name), target))
    finally:
        os.close(dir_fd)
    return links, sockets
