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


def _stat_of(pid: int, proc_root: str) -> tuple[str, int, int] | None:
    """(comm, ppid, start time in clock ticks) from /proc/PID/stat; None when gone or hidden."""
    try:
        raw = _read(f"{proc_root}/{pid}/stat")
        close = raw.rindex(b")")
        fields = raw[close + 2 :].split()
        return _text(raw[raw.index(b"(") + 1 : close]), int(fields[1]), int(fields[19])
    except (_Gone, _Denied, OSError, ValueError, IndexError):
        return None


def _extended_name(pid: int, comm: str, proc_root: str) -> str:
    """psutil's name(): comm, extended from argv[0] when the kernel cut it at 15 characters."""
    if len(comm) < 15:
        return comm
    try:
        cmdline = _split_cmdline(_text(_read(f"{proc_root}/{pid}/cmdline")))
    except (_Gone, _Denied, OSError):
        return comm
    extended = os.path.basename(cmdline[0]) if cmdline else ""
    return extended if extended.startswith(comm) else comm


def _ancestors(ppid: int, start_ticks: int, proc_root: str) -> list[Ancestor]:
    """Parent, grandparent, ... of a process started at ``start_ticks``, as psutil's parent()
    walks them (a parent younger than its child is a reused pid: the walk stops), one stat
    read and one exe link each (psutil's objects cost ~4x that, for every exec sent up)."""
    out: list[Ancestor] = []
    child_start = start_ticks
    while ppid > 0 and len(out) < MAX_ANCESTORS:
        stat = _stat_of(ppid, proc_root)
        if stat is None or stat[2] > child_start:
            break
        comm, grandparent, started = stat
        exe, _, _ = _exe_of(ppid, proc_root)
        out.append(Ancestor(ppid, _extended_name(ppid, comm, proc_root), exe))
        if ppid <= 1:
            break
        ppid, child_start = grandparent, started
    return out


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


_READ_SIZE = 65536
ENVIRON_HEAD = 65536  # what a YARA match reads of an environ (gpuguard.detect.yara.scan)
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
    """The whole file (a bare open and read: a Python file object costs more than the read)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except (FileNotFoundError, ProcessLookupError):
        raise _Gone from None
    except PermissionError:
        raise _Denied from None
    try:
        chunks = []
        while chunk := os.read(fd, _READ_SIZE):
            chunks.append(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)
    except (FileNotFoundError, ProcessLookupError):
        raise _Gone from None
    except PermissionError:
        raise _Denied from None
    finally:
        os.close(fd)


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


_USERNAMES: dict[int, tuple[float, str]] = {}  # uid -> (when read, monotonic; name)
_USERNAME_TTL_S = 60.0  # a user renamed or added is seen within this
_USERNAMES_MAX = 4096


def _username(uid: int) -> str:
    """The user name of ``uid`` (the uid as text when it has none), from the password database
    at most once a minute per uid: NSS reads /etc/passwd on every call (~12 us, every exec)."""
    now = time.monotonic()
    cached = _USERNAMES.get(uid)
    if cached is not None and now - cached[0] < _USERNAME_TTL_S:
        return cached[1]
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = str(uid)
    if len(_USERNAMES) >= _USERNAMES_MAX:
        _USERNAMES.clear()
    _USERNAMES[uid] = (now, name)
    return name


def _ld_preload_of(
    pid: int, proc_root: str, environ_sink: dict[tuple[int, float], bytes] | None, key
) -> tuple[str | None, bool]:
    try:
        raw = _read(f"{proc_root}/{pid}/environ")
    except (_Gone, _Denied):
        return None, False
    except OSError:
        return None, False
    if environ_sink is not None:
        environ_sink[key] = raw[:ENVIRON_HEAD]
    value = None
    if b"LD_PRELOAD=" not in raw:  # most environments: no entry can start with it
        return value, True
    for entry in _text(raw).split("\x00"):
        if entry.startswith("LD_PRELOAD="):
            value = entry[len("LD_PRELOAD=") :]  # the last one wins, as in psutil's dict
    return value, True


def collect_process_facts(
    pid: int,
    proc_root: str = "/proc",
    with_ancestors: bool = True,
    environ_sink: dict[tuple[int, float], bytes] | None = None,
) -> ProcessFacts | None:
    """Facts about ``pid`` now, or ``None`` if it no longer exists.

    ``environ_sink``: gets ``{(pid, start time): the first ENVIRON_HEAD bytes of its environ}``
    when it was read, for a YARA match that would read it again (scan)."""
    base = f"{proc_root}/{pid}"
    try:
        stat_raw = _read(f"{base}/stat")
        close = stat_raw.rindex(b")")
        comm = _text(stat_raw[stat_raw.index(b"(") + 1 : close])
        fields = stat_raw[close + 2 :].split()
        ppid, threads = int(fields[1]), int(fields[17])
        start_ticks = int(fields[19])
        start_time = round(start_ticks / _CLOCK_TICKS + _boot_time(), 2)
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
        _ld_preload_of(pid, proc_root, environ_sink, (pid, start_time))
        if not kernel_thread
        else (None, False)
    )
    hugetlb_bytes, hugetlb_page_size, hugetlb_maps = (
        process_hugetlb(pid, proc_root, status_hugetlb_kib(status))
        if not kernel_thread
        else (None, None, [])
    )
    ancestors = _ancestors(ppid, start_ticks, proc_root) if with_ancestors else []
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
