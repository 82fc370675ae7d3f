"""Process facts from /proc (through psutil): fills :class:`ProcessFacts`.

Processes vanish at any moment: every read tolerates that and returns what it
got, or ``None`` when the process is gone.
"""

from __future__ import annotations

import os

import psutil

from gpuguard.events.process_facts import MAX_ANCESTORS, Ancestor, ProcessFacts
from gpuguard.sources.containers import container_from_cgroup, read_cgroup_path
from gpuguard.sources.huge_pages import process_hugetlb

_MEMFD_PREFIX = "/memfd:"


def _exe_of(pid: int, proc_root: str) -> tuple[str, bool, bool]:
    try:
        link = os.readlink(f"{proc_root}/{pid}/exe")
    except OSError:
        return "", False, False
    deleted = link.endswith(" (deleted)")
    if deleted:
        link = link[: -len(" (deleted)")]
    return link, deleted, link.startswith(_MEMFD_PREFIX)


def _exe_identity(pid: int, proc_root: str) -> tuple[int, int, int, int] | None:
    try:
        st = os.stat(f"{proc_root}/{pid}/exe")  # follows the link, works for deleted files
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _ld_preload(proc: psutil.Process) -> tuple[str | None, bool]:
    try:
        env = proc.environ()
    except (psutil.AccessDenied, psutil.ZombieProcess, psutil.NoSuchProcess, OSError):
        return None, False
    return env.get("LD_PRELOAD"), True


def _ancestors(proc: psutil.Process, proc_root: str) -> list[Ancestor]:
    out: list[Ancestor] = []
    try:
        parent = proc.parent()
        while parent is not None and len(out) < MAX_ANCESTORS:
            exe, _, _ = _exe_of(parent.pid, proc_root)
            out.append(Ancestor(parent.pid, parent.name(), exe))
            if parent.pid <= 1:
                break
            parent = parent.parent()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        pass
    return out


def collect_process_facts(
    pid: int, proc_root: str = "/proc", with_ancestors: bool = True
) -> ProcessFacts | None:
    """Facts about ``pid`` now, or ``None`` if it no longer exists."""
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            start_time = round(proc.create_time(), 2)
            ppid = proc.ppid()
            comm = proc.name()
            uids = proc.uids()
            try:
                username = proc.username()
            except (KeyError, psutil.AccessDenied):
                username = str(uids.real)
            try:
                cmdline = proc.cmdline()
            except (psutil.AccessDenied, psutil.ZombieProcess):
                cmdline = []
            try:
                cwd = proc.cwd()
            except (psutil.AccessDenied, psutil.ZombieProcess, OSError):
                cwd = ""
            try:
                rss = proc.memory_info().rss
                threads = proc.num_threads()
            except (psutil.AccessDenied, psutil.ZombieProcess):
                rss = threads = None
    except psutil.NoSuchProcess:
        return None
    except psutil.AccessDenied:
        return ProcessFacts(pid=pid, start_time=0.0)
    exe, deleted, memfd = _exe_of(pid, proc_root)
    # Kernel threads have no executable and no command line, and descend from kthreadd (2).
    kernel_thread = exe == "" and not cmdline and (ppid == 2 or pid == 2)
    cgroup = read_cgroup_path(pid, proc_root)
    container = container_from_cgroup(cgroup)
    ld_preload, environ_readable = _ld_preload(proc) if not kernel_thread else (None, False)
    hugetlb_bytes, hugetlb_page_size = (
        process_hugetlb(pid, proc_root) if not kernel_thread else (None, None)
    )
    return ProcessFacts(
        pid=pid,
        start_time=start_time,
        ppid=ppid,
        comm=comm,
        exe=exe,
        exe_deleted=deleted,
        exe_memfd=memfd,
        cmdline=cmdline,
        cwd=cwd,
        uid=uids.real,
        username=username,
        cgroup=cgroup,
        container_runtime=container.runtime,
        container_id=container.container_id,
        pod_uid=container.pod_uid,
        kernel_thread=kernel_thread,
        ld_preload=ld_preload,
        environ_readable=environ_readable,
        exe_identity=_exe_identity(pid, proc_root) if exe else None,
        ancestors=_ancestors(proc, proc_root) if with_ancestors else [],
        rss_bytes=rss,
        num_threads=threads,
        hugetlb_bytes=hugetlb_bytes,
        hugetlb_page_size=hugetlb_page_size,
    )
