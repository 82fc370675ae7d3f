"""Read a small file as another process sees it, without letting that process steer us elsewhere.

The agent runs as root on the host; the process it inspects may be in a
container and is possibly hostile.  A path it names (``-c ../../etc/shadow``,
or a ``config.json`` that is a symlink to ``/etc/shadow``) must resolve inside
*its* filesystem view, never the host's.
:func:`sha256_of_file` hashes an image read through ``/proc/PID/exe`` (allowlist, enrich,
kill-on-touch).

Details: docs/internals.md, "proc_files".
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import os
import stat
from collections import OrderedDict

_SYS_OPENAT2 = 437  # the same number on every architecture (added after the table was unified)
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_BENEATH = 0x08
_RESOLVE_IN_ROOT = 0x10
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
_DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
MAX_HASH_BYTES = 1 << 30  # a larger file is not hashed


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_openat2_works: bool | None = None  # learnt on first use


def _openat2(dirfd: int, path: str, resolve: int) -> int:
    how = _OpenHow(_OPEN_FLAGS, 0, resolve | _RESOLVE_NO_MAGICLINKS)
    fd = _libc.syscall(
        ctypes.c_long(_SYS_OPENAT2),
        ctypes.c_int(dirfd),
        ctypes.c_char_p(os.fsencode(path)),
        ctypes.byref(how),
        ctypes.c_size_t(ctypes.sizeof(how)),
    )
    if fd < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), path)
    return fd


def _open_walking(dirfd: int, path: str) -> int:
    """The fallback: every component opened with O_NOFOLLOW; symlinks and '..' refuse the path."""
    parts = [p for p in path.split("/") if p and p != "."]
    if not parts or ".." in parts:
        raise OSError(errno.EXDEV, "path leaves the directory", path)
    fd = os.dup(dirfd)
    try:
        for part in parts[:-1]:
            next_fd = os.open(part, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = next_fd
        return os.open(parts[-1], _OPEN_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
    finally:
        os.close(fd)


def _open_inside(dirfd: int, path: str, resolve: int) -> int:
    global _openat2_works
    if _openat2_works is not False:
        try:
            fd = _openat2(dirfd, path, resolve)
            _openat2_works = True
            return fd
        except OSError as exc:
            if exc.errno not in (errno.ENOSYS, errno.EPERM) or _openat2_works:
                raise
            _openat2_works = False
    return _open_walking(dirfd, path)


def names_absent_in_cwd(
    pid: int, names: tuple[str, ...], proc_root: str = "/proc"
) -> tuple[int, int, int] | None:
    """``(st_dev, st_ino, st_mtime_ns)`` of the working directory of ``pid`` when none of the
    plain ``names`` exists in it (each looked up there, as :func:`read_process_file` does);
    None when one exists, cannot be looked up, or the directory cannot be opened.

    Creating, removing or renaming an entry changes the directory's mtime, so a caller may
    treat another process with the same working directory and mtime as having none of
    ``names`` either (``gpuguard scan`` does, within one run)."""
    try:
        dirfd = os.open(f"{proc_root}/{pid}/cwd", _DIR_FLAGS)
    except OSError:
        return None
    try:
        st = os.fstat(dirfd)
        for name in names:
            try:
                os.close(_open_inside(dirfd, name, _RESOLVE_BENEATH))
            except FileNotFoundError:
                continue
            except OSError as exc:
                if exc.errno == errno.ENOENT:
                    continue
            return None  # there (or not looked up): the caller reads it
        return (st.st_dev, st.st_ino, st.st_mtime_ns)
    except OSError:
        return None
    finally:
        os.close(dirfd)


def cwd_identity(pid: int, proc_root: str = "/proc") -> tuple[int, int, int] | None:
    """``(st_dev, st_ino, st_mtime_ns)`` of the working directory of ``pid`` (None: unreadable)."""
    try:
        st = os.stat(f"{proc_root}/{pid}/cwd")
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_mtime_ns)


def read_process_file(pid: int, path: str, max_bytes: int, proc_root: str = "/proc") -> str | None:
    """The text of ``path`` as process ``pid`` names it (absolute: in its root; relative: under its
    working directory), if it is a regular file of at most ``max_bytes``; else None."""
    if not path or "\x00" in path:
        return None
    anchor = f"{proc_root}/{pid}/root" if path.startswith("/") else f"{proc_root}/{pid}/cwd"
    resolve = _RESOLVE_IN_ROOT if path.startswith("/") else _RESOLVE_BENEATH
    try:
        dirfd = os.open(anchor, _DIR_FLAGS)
    except OSError:
        return None
    try:
        fd = _open_inside(dirfd, path, resolve)
    except OSError:
        return None
    finally:
        os.close(dirfd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > max_bytes:
            return None
        return os.read(fd, max_bytes).decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def sha256_of_file(path: str, limit: int = MAX_HASH_BYTES) -> str | None:
    """Hex sha256 of a file (None when unreadable or larger than ``limit``)."""
    digest = hashlib.sha256()
    total = 0
    try:
        with open(path, "rb") as handle:
            while chunk := handle.read(1 << 20):
                total += len(chunk)
                if total > limit:
                    return None
                digest.update(chunk)
    except OSError:
        return None
    return digest.hexdigest()


class ExeHashes:
    """The sha256 of a process's running image (``/proc/PID/exe``), once per executable file:
    read lazily, for the records of a finding (hashing every image at exec would tax each start)."""

    def __init__(self, proc_root: str = "/proc", limit: int = 64 << 20, cached: int = 256) -> None:
        self.proc_root = proc_root
        self.limit = limit  # a larger executable is not hashed (no stall)
        self.cached = cached  # images whose hash is kept, the least recently used dropped
        self._hashes: OrderedDict[tuple, str] = OrderedDict()  # only hashes read

    def of(self, pid: int, identity: tuple | None) -> str | None:
        """``identity``: the image's (device, inode, size, mtime) from its facts, the cache key."""
        if identity is not None and identity in self._hashes:
            self._hashes.move_to_end(identity)
            return self._hashes[identity]
        digest = sha256_of_file(f"{self.proc_root}/{pid}/exe", self.limit)
        # a failed read (the process gone, a file over the limit) is not kept: another process
        # of the same image must still be hashed
        if identity is not None and digest is not None:
            self._hashes[identity] = digest
            if len(self._hashes) > self.cached:
                self._hashes.popitem(last=False)
        return digest
