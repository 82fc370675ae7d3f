"""What a process first seen late still shows about its config, even after it was deleted.

The files it holds open, and the config its command line names.

A miner that reads ``config.json`` and deletes it at once leaves nothing for a reader who
comes later (the agent's first sweep after a restart, a scan), unless it still holds the
file open (then the text is readable through /proc/PID/fd/N, deleted or not) or its command
line still names it (then the deletion itself is the fact).  Both go into
``ProcessFacts.config_files`` so recordings and replay see them:

* held open: ``"<path> (deleted; read through its open descriptor)"`` -> the text (or the
  path itself when the file is still there);
* named but gone: ``"<path> (deleted after start)"`` -> "" (nothing left to read).

Only processes worth the look are examined (a config named in argv, hugetlb memory, a
deleted or fileless executable), at most ``MAX_FDS`` descriptors each; only regular files
are opened (never FIFOs or devices), at most ``MAX_BYTES`` read.
"""

from __future__ import annotations

import os
import stat

from gpuguard.events.process_facts import ProcessFacts

MAX_FDS = 256
MAX_BYTES = 65536
MAX_FILES = 4
DELETED_HELD = " (deleted; read through its open descriptor)"
DELETED_GONE = " (deleted after start)"
_CONFIG_SUFFIXES = (".json", ".ini", ".conf", ".cfg", ".txt", ".yaml", ".yml", ".toml")


def _looks_like_config(path: str) -> bool:
    return path.lower().endswith(_CONFIG_SUFFIXES)


def held_config_files(pid: int, proc_root: str = "/proc") -> dict[str, str]:
    """Config-like regular files it holds open, read through its descriptors."""
    out: dict[str, str] = {}
    fd_dir = f"{proc_root}/{pid}/fd"
    try:
        names = os.listdir(fd_dir)[:MAX_FDS]
    except OSError:
        return out
    for name in names:
        if len(out) >= MAX_FILES:
            break
        try:
            target = os.readlink(f"{fd_dir}/{name}")
        except OSError:
            continue
        deleted = target.endswith(" (deleted)")
        path = target[: -len(" (deleted)")] if deleted else target
        if not path.startswith("/") or not _looks_like_config(path):
            continue
        try:
            if not stat.S_ISREG(os.stat(f"{fd_dir}/{name}").st_mode):
                continue
            fd = os.open(f"{fd_dir}/{name}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_BYTES:
                continue
            text = os.pread(fd, MAX_BYTES, 0).decode("utf-8", "replace")
        except OSError:
            continue
        finally:
            os.close(fd)
        out[(path + DELETED_HELD) if deleted else path] = text
    return out


def _gone_in_view(pid: int, path: str, proc_root: str) -> bool:
    """True when ``path``, as the process names it, does not exist in its filesystem view."""
    anchor = f"{proc_root}/{pid}/root" if path.startswith("/") else f"{proc_root}/{pid}/cwd"
    try:
        os.lstat(f"{anchor}/{path.lstrip('/')}")
    except FileNotFoundError:
        return os.path.isdir(anchor)  # the process (and so its view) is still there
    except OSError:
        return False
    return False


def add_late_config_evidence(
    facts: ProcessFacts, named: list[str], proc_root: str = "/proc"
) -> ProcessFacts:
    """Add held-open and deleted config files to ``facts.config_files`` (see the module doc);
    ``named`` are the config paths its command line names."""
    if facts.kernel_thread:
        return facts
    files = facts.config_files
    # `sh -c CMD` and `python -c CODE` name no file: only a path with a config suffix counts
    named = [p for p in named if _looks_like_config(p) and not any(c.isspace() for c in p)]
    for path in named[:MAX_FILES]:
        if path not in files and _gone_in_view(facts.pid, path, proc_root):
            files[path + DELETED_GONE] = ""
    worth_fds = named or facts.hugetlb_bytes or facts.exe_deleted or facts.exe_memfd
    if worth_fds:
        for path, text in held_config_files(facts.pid, proc_root).items():
            if len(files) < MAX_FILES + 2 and path not in files:
                files[path] = text
    return facts


def deleted_config_paths(files: dict[str, str]) -> set[str]:
    """Config paths recorded as deleted after start (held open or gone)."""
    out = set()
    for key in files:
        for marker in (DELETED_HELD, DELETED_GONE):
            if key.endswith(marker):
                out.add(key[: -len(marker)])
    return out
