"""Open configuration files safely: regular files only, never blocking, and only if root's own.

Every file gpuguard reads from configuration (rules, YARA files) is opened
with ``O_NONBLOCK`` and checked with ``fstat`` to be a regular file before a
byte is read: a FIFO, a device such as /dev/zero or a directory is named as
what it is instead of hanging or filling memory, and a size cap bounds what
is read.

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


def untrusted_reason(path: Path, what: str = "rules file") -> tuple[str, str] | None:
    """``(cause, fix)`` when ``path`` is not safe to trust, else None (missing files are not judged here).

    ``what`` names the file in the cause ("rules file", "agent config", "metrics web config")."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    mode = stat.S_IMODE(st.st_mode)
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (
            f"refusing {what} {path}: it is writable by group/others (mode {mode:04o})",
            f"chmod go-w {path}",
        )
    if os.geteuid() == 0 and st.st_uid != 0:
        return (
            f"refusing {what} {path}: it is owned by uid {st.st_uid}, not root, and gpuguard runs as root",
            f"chown root: {path}",
        )
    try:
        parent = os.stat(path.parent)
    except OSError:
        return None
    parent_mode = stat.S_IMODE(parent.st_mode)
    if parent_mode & (stat.S_IWGRP | stat.S_IWOTH) and not parent_mode & stat.S_ISVTX:
        return (
            f"refusing {what} {path}: its directory {path.parent} is writable by group/others "
            f"(mode {parent_mode:04o}), so the file can be replaced",
            f"chmod go-w {path.parent}",
        )
    return None


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _open_regular(path: Path, what: str) -> tuple[int | None, tuple[str, str] | None]:
    """An fd of ``path`` when it is a regular file, else ``(None, (cause, fix))``."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except FileNotFoundError:
        return None, (f"{what} not found", "check the path")
    except OSError as exc:
        try:
            kind = _kind(os.stat(path).st_mode)
        except OSError:
            kind = ""
        cause = (
            f"{what} is {kind}, not a regular file"
            if kind
            else f"cannot open {what}: {exc.strerror}"
        )
        return None, (cause, "name a regular file")
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        return None, (f"{what} is {_kind(st.st_mode)}, not a regular file", "name a regular file")
    return fd, None


def not_regular_reason(path: Path, what: str) -> tuple[str, str] | None:
    """``(cause, fix)`` (the cause does not repeat the path) when ``path`` is missing or not a
    regular file (checked without blocking), else None."""
    fd, reason = _open_regular(path, what)
    if fd is not None:
        os.close(fd)
    return reason


def read_regular_file(path: Path, max_bytes: int, what: str) -> bytes:
    """The bytes of regular file ``path`` (at most ``max_bytes``); raises GpuguardError otherwise."""
    fd, reason = _open_regular(path, what)
    if fd is None:
        raise GpuguardError(*reason)  # type: ignore[misc]
    too_big = GpuguardError(
        f"{what} is larger than the {max_bytes // 1024} KiB limit",
        f"split it into smaller files (each under {max_bytes // 1024} KiB)",
    )
    if os.fstat(fd).st_size > max_bytes:
        os.close(fd)
        raise too_big
    try:
        chunks, size = [], 0
        while size <= max_bytes:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise GpuguardError(f"cannot read {what}: {exc.strerror}", "check the file") from None
    finally:
        os.close(fd)
    if size > max_bytes:
        raise too_big
    return b"".join(chunks)


def refusal_reason(path: Path, what: str, named: str | None = None) -> tuple[str, str] | None:
    """``(cause, fix)`` when ``path`` is not a regular file (called ``named``, by default
    ``what``: a FIFO or a device is named as such, never opened blocking) or not one root can
    trust (called ``what``), else None."""
    return not_regular_reason(path, named or what) or untrusted_reason(path, what)
