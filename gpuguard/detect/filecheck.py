"""Refuse rule files an unprivileged user could have changed.

Rules decide what a root agent flags, allowlists and acts on, so a file (or
its directory) writable by group or others, or — when we run as root — owned
by anyone but root, is refused: otherwise any local user could allowlist
their miner.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from gpuguard.errors import GpuguardError


def untrusted_reason(path: Path) -> tuple[str, str] | None:
    """``(cause, fix)`` when ``path`` is not safe to trust, else None (missing files are not judged here)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    mode = stat.S_IMODE(st.st_mode)
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (f"refusing rules file {path}: it is writable by group/others (mode {mode:04o})",
                f"chmod go-w {path}")
    if os.geteuid() == 0 and st.st_uid != 0:
        return (f"refusing rules file {path}: it is owned by uid {st.st_uid}, not root, and gpuguard runs as root",
                f"chown root: {path}")
    try:
        parent = os.stat(path.parent)
    except OSError:
        return None
    parent_mode = stat.S_IMODE(parent.st_mode)
    if parent_mode & (stat.S_IWGRP | stat.S_IWOTH) and not parent_mode & stat.S_ISVTX:
        return (f"refusing rules file {path}: its directory {path.parent} is writable by group/others "
                f"(mode {parent_mode:04o}), so the file can be replaced",
                f"chmod go-w {path.parent}")
    return None


def check_trusted_file(path: Path) -> None:
    """Raise :class:`GpuguardError` when ``path`` could have been written by a non-root user."""
    reason = untrusted_reason(path)
    if reason is not None:
        raise GpuguardError(*reason)
