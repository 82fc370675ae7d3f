"""Processes the kernel has but a /proc directory listing does not show.

A preload rootkit (an LD_PRELOAD or /etc/ld.so.preload library hooking
readdir) hides a miner by dropping its ``/proc/<pid>`` entry from directory
listings; the kernel still answers ``/proc/<pid>/status`` for it.  Probing
every pid up to ``pid_max`` (4 million on many hosts) is too slow for a
one-shot scan, so the candidates come from views a readdir hook does not filter:

* ``cgroup.procs`` of every cgroup (read(2), not readdir: the kernel's full
  list of processes; bounded by ``MAX_CGROUP_DIRS``),
* the ``PPid`` of every listed process (a hidden parent of a visible child),
* pids that other sources report (NVML / amdsmi / DRM process lists, sockets),
* the neighbourhood of the last pid the kernel handed out (``/proc/loadavg``),
  where a freshly started miner lives (``RECENT_PID_WINDOW`` pids).

A candidate is hidden when ``/proc/<n>/status`` exists, names ``n`` as its own
Tgid (threads have their own /proc/<tid> too but are not listed by design),
and ``n`` is absent from the listing taken before *and* after the probe (a
process that merely started mid-scan appears in the second listing).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field

MAX_CGROUP_DIRS = 20000
RECENT_PID_WINDOW = 512


@dataclass(slots=True, frozen=True)
class HiddenPid:
    pid: int
    name: str  # "Name:" from status (the comm; attacker-chosen)
    sources: tuple[str, ...]  # where the pid was seen, e.g. ("cgroup.procs", "gpu")


@dataclass(slots=True)
class HiddenPidScan:
    hidden: list[HiddenPid] = field(default_factory=list)
    candidates_checked: int = 0
    unavailable: list[str] = field(default_factory=list)


def list_proc_pids(proc_root: str = "/proc") -> set[int]:
    """Pids in a /proc directory listing (what ``ps`` sees, and what a readdir hook filters)."""
    return {int(name) for name in os.listdir(proc_root) if name.isdigit()}


def _status_tgid_and_name(pid: int, proc_root: str) -> tuple[int, str] | None:
    try:
        with open(f"{proc_root}/{pid}/status", "rb") as f:
            raw = f.read(4096)
    except OSError:
        return None
    name, tgid = "", None
    for line in raw.decode("utf-8", "surrogateescape").splitlines():
        if line.startswith("Name:"):
            name = line[5:].strip()
        elif line.startswith("Tgid:"):
            try:
                tgid = int(line[5:].strip())
            except ValueError:
                return None
            break
    return (tgid, name) if tgid is not None else None


def find_cgroup_root(proc_root: str = "/proc") -> str | None:
    """The cgroup v2 mount (holds every process, hybrid layout included), else a v1 hierarchy."""
    v1 = None
    try:
        with open(f"{proc_root}/self/mountinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                pre, _, post = line.partition(" - ")
                fstype = post.split(" ", 1)[0]
                mount_point = pre.split(" ")[4] if len(pre.split(" ")) > 4 else ""
                if fstype == "cgroup2":
                    return mount_point
                if fstype == "cgroup" and v1 is None:
                    v1 = mount_point
    except OSError:
        return None
    return v1


def pids_from_cgroups(cgroup_root: str) -> tuple[set[int], bool]:
    """(every pid in any cgroup.procs under ``cgroup_root``, whether the walk was complete)."""
    pids: set[int] = set()
    dirs = 0
    complete = True
    for dirpath, _dirnames, _ in os.walk(cgroup_root):
        dirs += 1
        if dirs > MAX_CGROUP_DIRS:
            complete = False
            break
        try:
            with open(os.path.join(dirpath, "cgroup.procs"), "rb") as f:
                for line in f.read().split():
                    if line.isdigit():
                        pids.add(int(line))
        except OSError:
            continue
    return pids, complete


def last_allocated_pid(proc_root: str = "/proc") -> int | None:
    try:
        with open(f"{proc_root}/loadavg") as f:
            return int(f.read().split()[4])
    except (OSError, ValueError, IndexError):
        return None


def find_hidden_pids(
    listed: set[int],
    parent_pids: Iterable[int] = (),
    reported: dict[int, str] | None = None,
    proc_root: str = "/proc",
    use_cgroups: bool = True,
) -> HiddenPidScan:
    """Probe the candidate pids above; ``listed`` is the listing the rest of the scan used.

    ``reported`` maps pids other sources saw to the source name ("gpu", ...).
    """
    scan = HiddenPidScan()
    sources: dict[int, set[str]] = {}

    def add(pid: int, source: str) -> None:
        if pid > 0 and pid not in listed:
            sources.setdefault(pid, set()).add(source)

    if use_cgroups:
        cgroup_root = find_cgroup_root(proc_root)
        if cgroup_root is None:
            scan.unavailable.append(
                "hidden processes: no cgroup hierarchy is mounted; cgroup.procs not cross-checked"
            )
        else:
            cgroup_pids, complete = pids_from_cgroups(cgroup_root)
            if not complete:
                scan.unavailable.append(
                    f"hidden processes: more than {MAX_CGROUP_DIRS} cgroups; the rest were not cross-checked"
                )
            for pid in cgroup_pids:
                add(pid, "cgroup.procs")
    for pid in parent_pids:
        add(pid, "parent-of-listed")
    for pid, source in (reported or {}).items():
        add(pid, source)
    last = last_allocated_pid(proc_root)
    if last is not None:
        for pid in range(max(1, last - RECENT_PID_WINDOW), last + 1):
            add(pid, "recent-pid")

    suspects: dict[int, str] = {}
    for pid in sorted(sources):
        scan.candidates_checked += 1
        found = _status_tgid_and_name(pid, proc_root)
        if found is not None and found[0] == pid:
            suspects[pid] = found[1]
    if suspects:
        relisted = list_proc_pids(proc_root)
        for pid, name in suspects.items():
            if pid not in relisted:
                scan.hidden.append(HiddenPid(pid, name, tuple(sorted(sources[pid]))))
    return scan
