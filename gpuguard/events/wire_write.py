"""Writing a recording: a new regular file, items packed whole, an end marker and a CRC-32.

Items are packed into a buffer that goes to the file whole, so a crash or a full disk leaves
a readable prefix (``wire`` reads it and says where it stops).
"""

from __future__ import annotations

import errno
import os
import socket
import stat
import time
import zlib
from typing import Any

import msgpack

from gpuguard import __version__
from gpuguard.errors import GpuguardError
from gpuguard.events.abi import ABI_VERSION
from gpuguard.events.wire_format import (
    END_KIND,
    FORMAT_NAME,
    FORMAT_VERSION,
    UNICODE_ERRORS,
    Item,
    item_record,
)

_FLUSH_BYTES = 256 << 10


def _header(meta: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "abi": ABI_VERSION,
        "created": time.time(),
        "host": socket.gethostname(),
        "gpuguard": __version__,
        "meta": dict(meta or {}),
    }


class RecordingWriteFailed(GpuguardError):
    """The disk refused a write (full, quota, I/O error): what reached it is a readable prefix."""

    def __init__(self, path: str, items: int, size: int, strerror: str) -> None:
        super().__init__(
            f"{path}: {strerror} after {items} items ({size} bytes) were written; the recording stops there, "
            "without its end marker",
            "free space on that disk or record to another one; `gpuguard replay` reads the items written",
        )
        self.items = items
        self.size = size


def _open_for_recording(path: str, overwrite: bool) -> int:
    """A new (or, on purpose, truncated) regular file; never blocks on a FIFO, never writes a device."""
    flags = (
        os.O_WRONLY
        | os.O_CREAT
        | os.O_CLOEXEC
        | os.O_NONBLOCK
        | (os.O_TRUNC if overwrite else os.O_EXCL)
    )
    try:
        fd = os.open(path, flags, 0o644)
    except FileExistsError:
        raise GpuguardError(
            f"{path} already exists; a recording is never overwritten by default",
            "choose another output file, or overwrite it on purpose (`gpuguard record --force`)",
        ) from None
    except OSError as exc:
        if (
            exc.errno == errno.ENXIO
        ):  # a FIFO nobody reads: O_NONBLOCK made open() fail instead of hang
            raise _not_regular(path, "a FIFO") from None
        raise GpuguardError(
            f"cannot create {path}: {exc.strerror}", "check the directory and its permissions"
        ) from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        what = {
            stat.S_IFIFO: "a FIFO",
            stat.S_IFCHR: "a character device",
            stat.S_IFBLK: "a block device",
            stat.S_IFSOCK: "a socket",
        }.get(stat.S_IFMT(mode), "not a regular file")
        raise _not_regular(path, what)
    os.set_blocking(fd, True)
    return fd


def _not_regular(path: str, what: str) -> GpuguardError:
    return GpuguardError(
        f"{path} is {what}; a recording is written to a regular file only (it is checksummed "
        "and synced to disk)",
        "choose a file on a disk",
    )


class RecordingWriter:
    """Appends items to a new recording; a crash or a full disk leaves a readable prefix.

    Items are packed into a buffer that goes to the file whole, so the file only
    ever ends inside the last write; :meth:`flush` bounds what a crash can lose.
    A write the disk refuses raises :class:`RecordingWriteFailed` (once) and
    closes the file.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        meta: dict[str, Any] | None = None,
        overwrite: bool = False,
    ) -> None:
        self.path = os.fspath(path)
        self._fd: int | None = _open_for_recording(self.path, overwrite)
        self._packer = msgpack.Packer(use_bin_type=True, unicode_errors=UNICODE_ERRORS)
        self._buffer = bytearray()
        self._crc = 0
        self.items_written = 0
        self.items_on_disk = 0  # items whose bytes all reached the file
        self.bytes_on_disk = 0
        self._append(self._packer.pack(_header(meta)))
        self.flush()

    def _append(self, packed: bytes) -> None:
        self._crc = zlib.crc32(packed, self._crc)
        self._buffer += packed

    def write(self, item: Item) -> None:
        if self._fd is None:
            raise ValueError(f"{self.path}: recording already closed")
        self._append(self._packer.pack(item_record(item)))
        self.items_written += 1
        if len(self._buffer) >= _FLUSH_BYTES:
            self.flush()

    def flush(self) -> None:
        """Hand every item written so far to the operating system."""
        if self._fd is None or not self._buffer:
            return
        view = memoryview(self._buffer)
        try:
            while view:
                done = os.write(self._fd, view)
                self.bytes_on_disk += done
                view = view[done:]
        except OSError as exc:
            view.release()
            self._failed(exc)
        view.release()
        self._buffer.clear()
        self.items_on_disk = self.items_written

    def _failed(self, exc: OSError) -> None:
        self.abandon()
        raise RecordingWriteFailed(
            self.path, self.items_on_disk, self.bytes_on_disk, exc.strerror or str(exc)
        ) from None

    def close(self) -> None:
        """Write the end marker and close; a closed recording reads without damage."""
        if self._fd is None:
            return
        end = {"kind": END_KIND, "items": self.items_written, "crc32": self._crc}
        self._buffer += self._packer.pack(end)
        self.flush()
        try:
            os.fsync(self._fd)
        except OSError as exc:
            self._failed(exc)
        self.abandon()

    def abandon(self) -> None:
        """Close the file as it is (no end marker); nothing more is written."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            self._buffer.clear()
            os.close(fd)

    def __enter__(self) -> RecordingWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        # Items written before an exception are complete, so the file is closed
        # normally and stays readable to the end.
        self.close()
