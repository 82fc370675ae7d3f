"""Rule signals of who a process is: its names, executable, user, cgroup and environment."""

from __future__ import annotations

import os

from gpuguard.correlate.state import ProcessState
from gpuguard.detect.signals.definition import signal
from gpuguard.detect.signals.parsed import basename


@signal(
    "comm",
    "text",
    "identity",
    "kernel process name (15 characters, settable by the process)",
    reads=("comm",),
)
def comm(s: ProcessState, now: float) -> str | None:
    return s.comm or None


@signal("exe", "text", "identity", "resolved executable path", reads=("exe",))
def exe(s: ProcessState, now: float) -> str | None:
    return s.exe or None


@signal("exe_name", "text", "identity", "executable file name, lower-case", reads=("exe",))
def exe_name(s: ProcessState, now: float) -> str | None:
    return basename(s.exe).lower() or None


@signal("exe_dir", "text", "identity", "directory of the executable", reads=("exe",))
def exe_dir(s: ProcessState, now: float) -> str | None:
    return os.path.dirname(s.exe) or None if s.exe else None


@signal(
    "process_names",
    "texts",
    "identity",
    "comm, executable name and argv[0] name, lower-case",
    reads=("cmdline", "comm", "exe"),
)
def process_names(s: ProcessState, now: float) -> set[str]:
    names = {s.comm.lower(), basename(s.exe).lower()}
    if s.cmdline:
        names.add(basename(s.cmdline[0].split(" ", 1)[0]).lower())
    names.discard("")
    return names


@signal(
    "comm_differs_from_exe",
    "bool",
    "identity",
    "comm is not the executable's name, nor argv[0]/argv[1] (a script) — masquerading",
    reads=("cmdline", "comm", "exe"),
)
def comm_differs_from_exe(s: ProcessState, now: float) -> bool | None:
    if not s.comm or not s.exe:
        return None
    comm = s.comm[:15]
    candidates = [basename(s.exe)] + [basename(a.split(" ", 1)[0]) for a in s.cmdline[:2]]
    if s.exe.startswith("/memfd:"):
        candidates.append(s.exe[len("/memfd:") :])
    for name in candidates:
        short = name[:15]
        # "python3" runs python3.11: a prefix ending before a letter is the same program.
        if short == comm or (short.startswith(comm) and not short[len(comm)].isalpha()):
            return False
    return True


@signal(
    "kernel_thread",
    "bool",
    "identity",
    "a real kernel thread (no executable, child of kthreadd)",
    reads=("facts.kernel_thread",),
)
def kernel_thread(s: ProcessState, now: float) -> bool | None:
    return s.facts.kernel_thread if s.facts is not None else None


@signal(
    "has_executable", "bool", "identity", "the process runs a user-space executable", reads=("exe",)
)
def has_executable(s: ProcessState, now: float) -> bool:
    return bool(s.exe)


@signal(
    "cmdline_bracketed",
    "bool",
    "identity",
    "command line is one '[name]' word like a kernel thread's, yet it has an executable",
    reads=("cmdline", "exe"),
)
def cmdline_bracketed(s: ProcessState, now: float) -> bool:
    text = " ".join(s.cmdline).strip()
    return bool(s.exe) and text.startswith("[") and text.endswith("]")


@signal(
    "exe_deleted",
    "bool",
    "identity",
    "the executable file was deleted after start",
    reads=("facts.exe_deleted",),
)
def exe_deleted(s: ProcessState, now: float) -> bool | None:
    return s.facts.exe_deleted if s.facts is not None else None


@signal(
    "exe_memfd",
    "bool",
    "identity",
    "the executable is an anonymous memfd (fileless)",
    reads=("exe", "facts.exe_memfd"),
)
def exe_memfd(s: ProcessState, now: float) -> bool:
    return (s.facts.exe_memfd if s.facts is not None else False) or s.exe.startswith("/memfd:")


@signal(
    "exe_memfd_name",
    "text",
    "identity",
    "name the memfd executable was created with (runc_cloned:/proc/self/exe, sealed-...)",
    reads=("exe",),
)
def exe_memfd_name(s: ProcessState, now: float) -> str | None:
    return s.exe[len("/memfd:") :] or None if s.exe.startswith("/memfd:") else None


@signal("user", "text", "identity", "user name of the real uid", reads=("facts.username",))
def user(s: ProcessState, now: float) -> str | None:
    return (s.facts.username or None) if s.facts is not None else None


@signal("uid", "number", "identity", "real uid", reads=("facts.uid",))
def uid(s: ProcessState, now: float) -> int | None:
    return s.facts.uid if s.facts is not None and s.facts.uid >= 0 else None


@signal("cgroup", "text", "identity", "cgroup path", reads=("facts.cgroup",))
def cgroup(s: ProcessState, now: float) -> str | None:
    return (s.facts.cgroup or None) if s.facts is not None else None


@signal(
    "container_id",
    "text",
    "identity",
    "container id from the cgroup, if in a container",
    reads=("facts.container_id",),
)
def container_id(s: ProcessState, now: float) -> str | None:
    return s.facts.container_id if s.facts is not None else None


@signal(
    "in_container",
    "bool",
    "identity",
    "the process runs in a container",
    reads=("facts.container_id",),
)
def in_container(s: ProcessState, now: float) -> bool | None:
    return s.facts.container_id is not None if s.facts is not None else None


@signal("ld_preload", "text", "identity", "LD_PRELOAD value", reads=("facts.ld_preload",))
def ld_preload(s: ProcessState, now: float) -> str | None:
    return s.facts.ld_preload if s.facts is not None else None


@signal(
    "ld_preload_set",
    "bool",
    "identity",
    "LD_PRELOAD is set (library injection, /proc hiding)",
    reads=("facts.environ_readable", "facts.ld_preload"),
)
def ld_preload_set(s: ProcessState, now: float) -> bool | None:
    if s.facts is None or not s.facts.environ_readable:
        return None
    return bool(s.facts.ld_preload)
