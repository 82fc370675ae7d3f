"""The response scope in the kernel's terms: the cgroup ids a kernel program may act in.

``response.cgroups`` and ``scope: containers`` are checked in user space by
:class:`~gpuguard.respond.process_control.Guard`; a program that acts in the kernel (kill-on-touch)
checks the same scope there, as a set of cgroup v2 ids (each the inode of its directory).
"""

from __future__ import annotations

import os
from collections.abc import Callable

from gpuguard.respond.cgroup_blocks import cgroup2_mount, cgroup2_of
from gpuguard.sources.proc.containers import container_from_cgroup, read_cgroup_path


def scope_cgroup_ids(
    scope: str,
    cgroups: tuple[str, ...],
    namespace_refusal: Callable[[int], str | None] | None = None,
) -> set[int] | None:
    """The cgroup ids a kernel program may act in (descendants included), or None for everywhere.

    ``response.cgroups``: those cgroups.  ``scope: containers``: the cgroup of every container
    running now (each container's own cgroup, found from its processes; one started later is
    outside until the next refresh: the scope errs towards not acting), within ``cgroups``
    when both are set.  A listed cgroup that does not exist adds nothing.
    ``namespace_refusal`` (the guard's, when ``never_act_namespaces`` or ``only_act_namespaces``
    is set): only the containers whose namespace it lets act, as ``scope: containers`` (a
    process outside a container is outside the kernel's scope then: user space decides).
    """
    if scope == "all" and not cgroups and namespace_refusal is None:
        return None
    mount = cgroup2_mount()
    listed = tuple(c.rstrip("/") or "/" for c in cgroups)
    if scope == "containers" or namespace_refusal is not None:
        paths = {
            p
            for p, pid in container_cgroup_pids().items()
            if (
                not listed
                or any(p == c or p.startswith(c.rstrip("/") + "/") or c == "/" for c in listed)
            )
            and (namespace_refusal is None or namespace_refusal(pid) is None)
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
    return set(container_cgroup_pids(proc_root))


def container_cgroup_pids(proc_root: str = "/proc") -> dict[str, int]:
    """The cgroup v2 path of each container running now, with a process of it."""
    found: dict[str, int] = {}
    for entry in os.listdir(proc_root):
        if not entry.isdigit():
            continue
        pid = int(entry)
        if not container_from_cgroup(read_cgroup_path(pid, proc_root)).container_id:
            continue
        try:
            # the v2 path the kernel checks (hybrid hosts differ)
            found.setdefault(cgroup2_of(pid), pid)
        except OSError:
            continue
    return found
