"""Files gpuguard keeps between runs (caches): read only when root's alone, written atomically.

A cache decides what a root agent trusts without redoing the work (a YARA verdict, a compiled
probe), so a file or directory that another user owns or can write is not read: the caller
gets a note instead and does the work again.  Writes go to a temporary file in the same
directory, mode 0600, renamed over the old one, so a reader never sees half a file.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from gpuguard.errors import with_fix


def unsafe_reason(st: os.stat_result, what: str) -> str | None:
    """Why a file or directory with this ``stat`` must not be trusted, or None."""
    if st.st_uid != 0:
        return f"{what} is owned by uid {st.st_uid}, not root"
    mode = stat.S_IMODE(st.st_mode)
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{what} is writable by group/others (mode {mode:04o})"
    return None


@dataclass(frozen=True, slots=True)
class CacheRead:
    """What :func:`read_cache_file` found: the bytes (None when absent or not trusted), what was
    wrong (None when nothing was), and whether the folder may be written (False when unsafe)."""

    content: bytes | None = None
    note: str | None = None
    folder_usable: bool = True


def read_cache_file(folder: Path, name: str, max_bytes: int, what: str) -> CacheRead:
    """``folder/name`` when root alone can change it and it fits ``max_bytes``; symlinks and
    non-regular files are not followed."""
    try:
        reason = unsafe_reason(os.stat(folder), f"{what} directory {folder}")
    except FileNotFoundError:
        return CacheRead()
    except OSError as exc:
        return CacheRead(
            note=f"{what} directory {folder} unusable: {exc.strerror}", folder_usable=False
        )
    if reason:
        return CacheRead(
            note=with_fix(
                f"{reason}; not using it", f"chown root: {folder} && chmod 0700 {folder}"
            ),
            folder_usable=False,
        )
    path = folder / name
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return CacheRead()
    except OSError as exc:
        return CacheRead(note=f"{what} {path} unusable: {exc.strerror}; it will be rewritten")
    try:
        st = os.fstat(fd)
        reason = unsafe_reason(st, f"{what} {path}") or (
            None if stat.S_ISREG(st.st_mode) else f"{path} is not a regular file"
        )
        if reason:
            return CacheRead(note=f"{reason}; ignoring it (it will be replaced)")
        raw = os.read(fd, max_bytes + 1)
    finally:
        os.close(fd)
    if len(raw) > max_bytes:
        return CacheRead(note=f"{what} {path} is over {max_bytes} bytes; it will be rewritten")
    return CacheRead(content=raw)


def write_cache_file(folder: Path, name: str, data: bytes, what: str) -> str | None:
    """Write ``folder/name`` atomically (the folder made 0700 when missing); a note when not."""
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        reason = unsafe_reason(os.stat(folder), f"{what} directory {folder}")
        if reason:
            return reason
        fd, tmp = tempfile.mkstemp(prefix=f".{name}-", dir=folder)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.chmod(tmp, 0o600)
            os.replace(tmp, folder / name)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError as exc:
        return f"could not write the {what} {folder / name}: {exc.strerror or exc}"
    return None
