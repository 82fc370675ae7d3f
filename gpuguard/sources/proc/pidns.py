"""PID namespaces: the pid a process sees for itself inside its container.

GPU drivers (NVML, amdsmi) and the host's /proc report host pids.  A process
in a container knows itself by another pid (its pid namespace's).  The kernel
lists both in ``/proc/PID/status`` as ``NSpid:`` — outermost (the reader's
/proc view) first, the process's own namespace last.
"""

from __future__ import annotations


def namespace_pids(pid: int, proc_root: str = "/proc") -> list[int] | None:
    """All pids of ``pid`` from the /proc view outward-in, or None if unreadable.

    A process in the root pid namespace has one entry; one in a container has
    two or more (``NSpid: 48121 7`` = host pid 48121, pid 7 in its container).
    """
    try:
        with open(f"{proc_root}/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"NSpid:"):
                    return [int(x) for x in line[6:].split()]
    except (OSError, ValueError):
        return None
    return None  # kernels before 4.1 have no NSpid line


def namespace_pid(pid: int, proc_root: str = "/proc") -> int | None:
    """The pid the process has in its own pid namespace, when it differs from ``pid``.

    ``None`` when the process lives in the same pid namespace as the /proc
    being read, has gone, or the kernel does not say.
    """
    pids = namespace_pids(pid, proc_root)
    if not pids or pids[-1] == pid:
        return None
    return pids[-1]
