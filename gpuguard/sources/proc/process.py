"""Process facts from /proc: fills :class:`ProcessFacts`.

Processes vanish at any moment: every read tolerates that and returns what it
got, or ``None`` when the process is gone.  The files are read directly (stat,
status, cmdline, the cwd and exe links, environ, cgroup), the values computed as
psutil computes them (start time, the name extended from argv[0] when comm was
cut at 15 characters, the command line split): psutil's per-process object and
its checks cost about four times the reads themselves, which a scan of every
process pays a thousand times over.
"""

from __future__ import annotations

import os
import pwd
import time

import psutil

from gpuguard.events.process_facts import MAX_ANCESTORS, Ancestor, ProcessFacts
from gpuguard.sources.proc.containers import container_from_cgroup, read_cgroup_path
from gpuguard.sources.proc.huge_pages import process_hugetlb, status_hugetlb_kib

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


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


_boot = (0.0, -1.0)  # (when read, monotonic; boot time): /proc/stat read once a second at most


def _boot_time() -> float:
    """psutil's boot time (/proc/stat btime), so start times match what psutil reports."""
    global _boot
    now = time.monotonic()
    if now - _boot[0] >= 1.0 or _boot[1] < 0:
        _boot = (now, psutil.boot_time())
    return _boot[1]


class _Gone(Exception):
    """The process exited while it was being read."""


class _Denied(Exception):
    """Its /proc files may not be read (hidepid, another user when not root)."""


def _read(path: str) -> bytes:
    try:
        with open(path, "rb", buffering=0) as f:
            return f.read()
    except (FileNotFoundError, ProcessLookupError):
        raise _Gone from None
    except PermissionError:
        raise _Denied from None


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def _split_cmdline(data: str) -> list[str]:
    """/proc/PID/cmdline split as psutil splits it (a retitled process may use spaces)."""
    if not data:
        return []
    sep = "\x00" if data.endswith("\x00") else " "
    if data.endswith(sep):
        data = data[:-1]
    cmdline = data.split(sep)
    if sep == "\x00" and len(cmdline) == 1 and " " in data:
        cmdline = data.split(" ")
    return cmdline


def _username(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _ld_preload_of(pid: int, proc_root: str) -> tuple[str | None, bool]:
    try:
        raw = _read(f"{proc_root}/{pid}/environ")
    except (_Gone, _Denied):
        return None, False
    except OSError:
        return None, False
    value = None
    for entry in _text(raw).split("\x00"):
        if entry.startswith("LD_PRELOAD="):
            value = entry[len("LD_PRELOAD=") :]  # the last one wins, as in psutil's dict
    return value, True


def collect_process_facts(
    pid: int, proc_root: str = "/proc", with_ancestors: bool = True
) -> ProcessFacts | None:
    """Facts about ``pid`` now, or ``None`` if it no longer exists."""
    base = f"{proc_root}/{pid}"
    try:
        stat_raw = _read(f"{base}/stat")
        close = stat_raw.rindex(b")")
        comm = _text(stat_raw[stat_raw.index(b"(") + 1 : close])
        fields = stat_raw[close + 2 :].split()
        ppid, threads = int(fields[1]), int(fields[17])
        start_time = round(int(fields[19]) / _CLOCK_TICKS + _boot_time(), 2)
        rss = int(fields[21]) * _PAGE_SIZE  # the kernel's rss count (psutil reads statm's)
        status = _read(f"{base}/status")
        at = status.find(b"\nUid:")
        if at < 0:
            raise _Gone  # a status without Uid: not a process we can describe
        uid = int(status[at:].split(None, 2)[1])
        try:
            cmdline = _split_cmdline(_text(_read(f"{base}/cmdline")))
        except _Denied:
            cmdline = []
    except _Gone:
        return None
    except _Denied:
        return ProcessFacts(pid=pid, start_time=0.0)
    except (ValueError, IndexError):
        return None  # a stat line cut short: the process went away mid-read
    if len(comm) >= 15 and cmdline:
        extended = os.path.basename(cmdline[0])
        if extended.startswith(comm):
            comm = extended  # psutil's name(): comm is cut at 15 characters
    try:
        cwd = os.readlink(f"{base}/cwd")
    except OSError:
        cwd = ""
    exe, deleted, memfd = _exe_of(pid, proc_root)
    # Kernel threads have no executable and no command line, and descend from kthreadd (2).
    kernel_thread = exe == "" and not cmdline and (ppid == 2 or pid == 2)
    cgroup = read_cgroup_path(pid, proc_root)
    container = container_from_cgroup(cgroup)
    ld_preload, environ_readable = (
        _ld_preload_of(pid, proc_root) if not kernel_thread else (None, False)
    )
    hugetlb_bytes, hugetlb_page_size, hugetlb_maps = (
        process_hugetlb(pid, proc_root, status_hugetlb_kib(status))
        if not kernel_thread
        else (None, None, [])
    )
    ancestors: list[Ancestor] = []
    if with_ancestors:
        try:
            ancestors = _ancestors(psutil.Process(pid), proc_root)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
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
        uid=uid,
        username=_username(uid),
        cgroup=cgroup,
        container_runtime=container.runtime,
        container_id=container.container_id,
        pod_uid=container.pod_uid,
        kernel_thread=kernel_thread,
        ld_preload=ld_preload,
        environ_readable=environ_readable,
        exe_identity=_exe_identity(pid, proc_root) if exe else None,
        ancestors=ancestors,
        rss_bytes=rss,
        num_threads=threads,
        hugetlb_bytes=hugetlb_bytes,
        hugetlb_page_size=hugetlb_page_size,
        hugetlb_mappings=[list(m) for m in hugetlb_maps],
    )
