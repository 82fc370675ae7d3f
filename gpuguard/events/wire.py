"""Reading a recording: every intact item in order, then what is damaged, where and why.

``gpuguard replay FILE``, the replay GPU sampler and the golden test cases read recordings
(``wire_format`` says what they hold, ``wire_write`` writes them).  Reading yields every
intact item, then raises :class:`RecordingDamaged` saying where and what.  The format, and
why the marker and checksum: docs/event-decoding.md, "Recordings".
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator
from typing import Any, BinaryIO

import msgpack

from gpuguard.errors import GpuguardError
from gpuguard.events.wire_format import (
    DECODERS,
    END_KIND,
    FORMAT_NAME,
    FORMAT_VERSION,
    UNICODE_ERRORS,
    BadItem,
    Item,
    decode_item,
)

MAX_ITEM_BYTES = 16 << 20  # a larger item can only be a corrupt length field
_READ_BLOCK = 1 << 20
_NO_FIX = "the items before the damage were read; record again for a complete file"
_MAGIC = msgpack.packb("format") + msgpack.packb(FORMAT_NAME)
_MAP_HEADERS = frozenset(bytes([b]) for b in [*range(0x80, 0x90), 0xDE])  # fixmap, map16


class RecordingDamaged(GpuguardError):
    """A recording that is truncated or corrupt after ``items_read`` good items."""

    def __init__(
        self, path: str, items_read: int, offset: int, what: str, fix: str = _NO_FIX
    ) -> None:
        super().__init__(f"{path}: {what}", fix)
        self.path = path
        self.items_read = items_read
        self.offset = offset


# --- reading -------------------------------------------------------------------------


def _new_unpacker() -> msgpack.Unpacker:
    return msgpack.Unpacker(
        raw=False,
        strict_map_key=False,
        unicode_errors=UNICODE_ERRORS,
        max_buffer_size=MAX_ITEM_BYTES + _READ_BLOCK,
    )


def _open(path: str | os.PathLike[str]) -> BinaryIO:
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise GpuguardError(
            f"{os.fspath(path)}: no such recording (not found)", "check the file name"
        ) from None
    except IsADirectoryError:
        raise GpuguardError(
            f"{os.fspath(path)} is a directory, not a recording", "pass the recording file"
        ) from None
    except OSError as exc:
        raise GpuguardError(
            f"cannot read {os.fspath(path)}: {exc.strerror}", "check its permissions"
        ) from None


def _not_a_recording(name: str) -> GpuguardError:
    return GpuguardError(
        f"{name} is not a gpuguard recording (it does not start with a {FORMAT_NAME!r} header)",
        "pass a file written by `gpuguard record --output FILE`",
    )


def _check_header(name: str, header: object) -> dict[str, Any]:
    if type(header) is not dict or header.get("format") != FORMAT_NAME:
        raise _not_a_recording(name)
    version = header.get("version")
    if version != FORMAT_VERSION:
        raise GpuguardError(
            f"{name} is recording format version {version!r}; this gpuguard reads version {FORMAT_VERSION}",
            f"replay it with the gpuguard that wrote it (gpuguard {header.get('gpuguard', '?')})",
        )
    return header


class _Reader:
    """Streams one recording: header check, items, end marker and checksum."""

    def __init__(self, file: BinaryIO, name: str) -> None:
        self.file = file
        self.name = name
        self.unpacker = _new_unpacker()
        self.items = 0  # good items yielded
        self.bad: list[str] = []  # "item N at byte B is not a valid record (why)", skipped
        self.fed = 0  # bytes handed to the unpacker
        # End of the last complete object.  The unpacker's tell() is only
        # meaningful right after a complete object: inside a partial one it
        # counts the bytes it has consumed so far.
        self.position = 0
        self.header: dict[str, Any] | None = None
        self.ended = False
        # The checksum covers the bytes before the end marker, which may start in
        # the block before the current one.
        self._blocks: list[tuple[int, int, bytes]] = []  # (start, crc before it, bytes)
        self._crc = 0
        self._head = b""  # the file's first bytes, to tell a cut header from another format

    def damaged(self, offset: int, what: str) -> RecordingDamaged:
        return RecordingDamaged(self.name, self.items, offset, what)

    def _feed(self, block: bytes) -> None:
        if not self.fed:
            self._head = block[:64]
        self._blocks = self._blocks[-1:] + [(self.fed, self._crc, block)]
        self._crc = zlib.crc32(block, self._crc)
        try:
            self.unpacker.feed(block)
        except msgpack.BufferFull:
            raise self.damaged(
                self.position,
                f"item {self.records + 1} at byte {self.position} "
                f"claims more than {MAX_ITEM_BYTES} bytes (a corrupt length); "
                f"the {self.items} items before it were read",
            ) from None
        self.fed += len(block)

    def _crc_before(self, offset: int) -> int | None:
        for start, crc_before, block in reversed(self._blocks):
            if start <= offset:
                return zlib.crc32(block[: offset - start], crc_before)
        return None

    def _not_msgpack(self, exc: Exception) -> GpuguardError:
        if self.header is None and not self._could_be_header_start():
            return _not_a_recording(self.name)
        offset = self.position
        where = "the header" if self.header is None else f"item {self.records + 1}"
        return self.damaged(
            offset,
            f"{where} at byte {offset} is not valid msgpack ({type(exc).__name__}: "
            f"{str(exc)[:80]}); the {self.items} items before it were read",
        )

    @property
    def records(self) -> int:
        """Every record after the header so far, good or bad (what the end marker counts)."""
        return self.items + len(self.bad)

    def _skip(self, offset: int, exc: BadItem) -> None:
        """A record that unpacked but is not valid: remember it with its index, go on with the next."""
        self.bad.append(f"item {self.records + 1} at byte {offset} is not a valid record ({exc})")

    def _unusual_record(self, offset: int, record: object) -> None:
        """Accept the end marker; anything else without a known kind is a bad item."""
        if type(record) is dict and record.get("kind") == END_KIND:
            self._end_marker(offset, record)
            return
        try:
            decode_item(record)
        except BadItem as exc:
            self._skip(offset, exc)
            return
        self._skip(offset, BadItem("record the reader could not dispatch"))

    def _bad_items(self) -> RecordingDamaged:
        shown = "; ".join(self.bad[:3]) + (
            f"; and {len(self.bad) - 3} more" if len(self.bad) > 3 else ""
        )
        return RecordingDamaged(
            self.name,
            self.items,
            0,
            f"{len(self.bad)} bad item(s) skipped: {shown}; the {self.items} other items were read",
            "the recording was altered or written by a broken recorder; record again",
        )

    def _next_object(self) -> tuple[int, object] | None:
        """(offset, object) of the next complete object, or None when more bytes are needed."""
        offset = self.position
        try:
            found = offset, self.unpacker.unpack()
        except msgpack.OutOfData:
            return None
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            raise self._not_msgpack(exc) from None
        self.position = self.unpacker.tell()
        return found

    def _end_marker(self, offset: int, marker: dict[str, Any]) -> None:
        if marker.get("items") != self.records:
            raise self.damaged(
                offset,
                f"end marker at byte {offset} counts {marker.get('items')!r} items but "
                f"{self.records} were read: the recording was altered after it was written",
            )
        if marker.get("crc32") != self._crc_before(offset):
            raise self.damaged(
                offset,
                f"checksum mismatch at the end marker (byte {offset}): the recording "
                f"was altered after it was written; its {self.items} items were read but may be wrong",
            )
        self.ended = True

    def _could_be_header_start(self) -> bool:
        # An incomplete first object is a cut recording only if it is a map that
        # holds (or was cut inside) the format key our writer puts first;
        # anything else (a PNG, a text file) is simply not a recording.
        head = self._head
        if head[:1] not in _MAP_HEADERS:
            return False
        body = head[1:] if head[0] != 0xDE else head[3:]
        return _MAGIC in body or _MAGIC.startswith(body)

    def read_header(self) -> dict[str, Any]:
        while self.header is None:
            block = self.file.read(_READ_BLOCK)
            if block:
                self._feed(block)
            found = self._next_object()
            if found is not None:
                self.header = _check_header(self.name, found[1])
            elif not block:
                if self.fed == 0:
                    raise self.damaged(
                        0, "is empty (0 bytes): the recorder stopped before writing anything"
                    )
                if not self._could_be_header_start():
                    raise _not_a_recording(self.name)
                raise self.damaged(
                    0,
                    f"truncated inside the header ({self.fed} bytes): the recording "
                    "stopped mid-write before its first item",
                )
        return self.header

    def items_iter(self) -> Iterator[Item]:
        self.read_header()
        decoders = DECODERS
        unpack, tell = self.unpacker.unpack, self.unpacker.tell
        # The hot loop of every replay: kept to one unpack, one lookup and one
        # decode per item; anything unusual goes to _unusual_record.
        while True:
            while True:
                try:
                    record = unpack()
                except msgpack.OutOfData:
                    break
                except (ValueError, TypeError, msgpack.UnpackException) as exc:
                    raise self._not_msgpack(exc) from None
                offset = self.position
                self.position = tell()
                if self.ended:
                    raise self.damaged(
                        offset, f"unexpected data at byte {offset} after the end marker"
                    )
                try:
                    decoder = decoders[record["kind"]]
                except (KeyError, TypeError, IndexError):
                    self._unusual_record(offset, record)
                    continue
                try:
                    item = decoder(record)
                except BadItem as exc:
                    self._skip(offset, exc)
                    continue
                self.items += 1
                yield item
            block = self.file.read(_READ_BLOCK)
            if not block:
                break
            self._feed(block)
        stopped = self.position
        if stopped < self.fed:
            raise self.damaged(
                stopped,
                f"truncated after item {self.records} at byte {stopped} (the recording "
                f"stopped mid-write; the {self.items} items before it were read)",
            )
        if not self.ended:
            raise self.damaged(
                stopped,
                f"ends after item {self.records} at byte {stopped} without its end marker "
                f"(the recorder did not close it: it crashed, was killed or is still running; "
                f"the {self.items} items before it were read)",
            )
        if self.bad:
            raise self._bad_items()


def read_header(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The header map of a recording; GpuguardError if it is not one."""
    with _open(path) as file:
        return _Reader(file, os.fspath(path)).read_header()


def iter_recording(path: str | os.PathLike[str]) -> Iterator[Item]:
    """Every item of a recording in order; RecordingDamaged after the last intact one.

    The file is opened at the call, so a missing file fails there, not at the
    first ``next()``.
    """
    return _iterate(_open(path), os.fspath(path))


def _iterate(file: BinaryIO, name: str) -> Iterator[Item]:
    with file:
        yield from _Reader(file, name).items_iter()
