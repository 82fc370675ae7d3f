"""The response scope in the kernel's terms: the cgroup ids a kernel program may act in.

``response.cgroups`` and ``scope: containers`` are checked in user space by
:class:`~gpuguard.respond.process_control.Guard`; a program that acts in the kernel (kill-on-touch)
checks the same scope there, as a set of cgroup v2 ids (each the inode of its directory).
"""

from __future__ import annotations

import os

from gpuguard.respond.cgroup_blocks import cgroup2_mount, cgroup2_of
from gpuguard.sources.proc.containers import container_from_cgroup, read_cgroup_path


def scope_cgroup_ids(scope: str, cgroups: tuple[str, ...]) -> set[int] | None:
    """The cgroup ids a kernel program may act in (descendants included), or None for everywhere.

    ``response.cgroups``: those cgroups.  ``scope: containers``: the cgroup of every container
    running now (each container's own cgroup, found from its processes; one started later is
    outside until the next refresh: the scope errs towards not acting), within ``cgroups``
    when both are set.  A listed cgroup that does not exist adds nothing.
    """
    if scope == "all" and not cgroups:
        return None
    mount = cgroup2_mount()
    listed = tuple(c.rstrip("/") or "/" for c in cgroups)
    if scope == "containers":
        paths = {
            p
            for p in container_cgroups()
            if not listed
            or any(p == c or p.startswith(c.rstrip("/") + "/") or c == "/" for c in listed)
        }
    else:
        paths = set(listed)
    ids = set()
    for path in paths:
        try:
            ids.add(os.stat(os.path.join(mount, path.lstrip("/"))).st_ino)
        except OSError:
            continue
    return ids


def container_cgroups(proc_root: str = "/proc") -> set[str]:
    """The cgroup v2 paths of the containers running now (from each process's cgroup)."""
    found = set()
    for entry in os.listdir(proc_root):
        if not entry.isdigit():
            continue
        pid = int(entry)
        if not container_from_cgroup(read_cgroup_path(pid, proc_root)).container_id:
            continue
        try:
            found.add(cgroup2_of(pid))  # the v2 path the kernel checks (hybrid hosts differ)
        except OSError:
            continue
    return found
