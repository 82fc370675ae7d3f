"""The recording format: events, GPU snapshots and process facts as a msgpack stream.

``gpuguard record --output FILE`` writes it; ``gpuguard replay FILE``, the replay GPU
sampler and the golden test cases read it.  A file is a header map, one map per item
(dispatched on ``"kind"``: an event kind from :data:`gpuguard.events.model.EVENT_TYPES`,
``"gpu_snapshot"`` or ``"process"``) and an end marker with the item count and a CRC-32.
Reading yields every intact item, then raises :class:`RecordingDamaged` saying where and what.
The format, and why the marker and checksum: docs/event-decoding.md, "Recordings".
"""

from __future__ import annotations

import dataclasses
import errno
import itertools
import operator
import os
import socket
import stat
import time
import zlib
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

import msgpack

from gpuguard import __version__
from gpuguard.errors import GpuguardError
from gpuguard.events.abi import ABI_VERSION
from gpuguard.events.gpu_snapshot import GpuSnapshot
from gpuguard.events.model import EVENT_TYPES, Event
from gpuguard.events.process_facts import ProcessFacts
from gpuguard.events.record_types import RecordTypeError, record_checker

FORMAT_NAME = "gpuguard-recording"
FORMAT_VERSION = 1
SNAPSHOT_KIND = "gpu_snapshot"
PROCESS_KIND = "process"
END_KIND = "recording_end"

Item = Event | GpuSnapshot | ProcessFacts

MAX_ITEM_BYTES = 16 << 20  # a larger item can only be a corrupt length field
_READ_BLOCK = 1 << 20
_FLUSH_BYTES = 256 << 10
_UNICODE_ERRORS = "surrogateescape"
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


# --- writing ---------------------------------------------------------------------------


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


def item_kind(item: Item) -> str:
    """The ``kind`` an item is stored (and shown in ``replay --json``) under: the one place that decides."""
    if isinstance(item, Event):
        return item.kind
    if isinstance(item, GpuSnapshot):
        return SNAPSHOT_KIND
    if isinstance(item, ProcessFacts):
        return PROCESS_KIND
    raise TypeError(
        f"cannot record a {type(item).__name__}: expected an Event, GpuSnapshot or ProcessFacts"
    )


def item_record(item: Item) -> dict[str, Any]:
    """The map an item is stored as."""
    if isinstance(item, Event):
        return item.to_record()
    return {"kind": item_kind(item), **item.to_record()}


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
        self._packer = msgpack.Packer(use_bin_type=True, unicode_errors=_UNICODE_ERRORS)
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


# --- decoding items ----------------------------------------------------------------


class _BadItem(Exception):
    """An item that unpacked but is not a valid record."""


_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "float": (float, int),
    "int": (int,),
    "str": (str,),
    "bytes": (bytes,),
    "bool": (bool,),
}


def _field_checks(cls: type[Event]) -> list[tuple[str, tuple[type, ...], tuple[type, ...] | None]]:
    """(field, allowed types, allowed element types) from the dataclass annotations."""
    checks = []
    for f in dataclasses.fields(cls):
        annotation = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
        if annotation in _FIELD_TYPES:
            checks.append((f.name, _FIELD_TYPES[annotation], None))
        elif annotation.startswith("dict"):
            checks.append((f.name, (dict,), None))
        elif annotation.startswith("list["):
            element = _FIELD_TYPES.get(annotation[5:-1])
            checks.append((f.name, (list,), element))
    return checks


def _event_decoder(cls: type[Event]) -> Callable[[dict[str, Any]], Event]:
    names = frozenset(f.name for f in dataclasses.fields(cls))
    checks = _field_checks(cls)
    kind = cls.kind
    # The common case in one C-level step: the tuple of the field value types
    # must be one of the allowed combinations (only float fields allow two).
    values_of = operator.attrgetter(*(name for name, _, _ in checks))
    allowed_types = frozenset(itertools.product(*(allowed for _, allowed, _ in checks)))
    element_checks = [(name, element) for name, _, element in checks if element is not None]

    def decode(record: dict[str, Any]) -> Event:
        del record["kind"]
        try:
            event = cls(**record)
        except TypeError:
            # Fields this version does not know (a newer recorder) are dropped;
            # a missing required field is damage.
            try:
                event = cls(**{k: v for k, v in record.items() if k in names})
            except TypeError as exc:
                raise _BadItem(f"{kind} record with bad fields ({exc})") from None
        if tuple(map(type, values_of(event))) not in allowed_types:
            for name, allowed, _ in checks:
                value = getattr(event, name)
                if type(value) not in allowed:
                    raise _BadItem(f"{kind} field {name!r} holds {type(value).__name__}")
        for name, element in element_checks:
            if any(type(v) not in element for v in getattr(event, name)):
                raise _BadItem(f"{kind} field {name!r} holds a non-{element[0].__name__} entry")
        return event

    return decode


_SNAPSHOT_CHECK = record_checker(GpuSnapshot)
_PROCESS_CHECK = record_checker(ProcessFacts)


def _checked(check: Callable[[Any], None], record: dict[str, Any], kind: str) -> None:
    try:
        check(record)
    except RecordTypeError as exc:
        raise _BadItem(f"{kind} record with bad fields ({exc})") from None


def _require_number(record: dict[str, Any], key: str, kind: str) -> None:
    if type(record.get(key)) not in (float, int):
        raise _BadItem(f"{kind} record without a numeric {key!r}")


def _decode_snapshot(record: dict[str, Any]) -> GpuSnapshot:
    _require_number(record, "time", SNAPSHOT_KIND)
    _checked(_SNAPSHOT_CHECK, record, SNAPSHOT_KIND)
    try:
        return GpuSnapshot.from_record(record)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise _BadItem(f"{SNAPSHOT_KIND} record with bad fields ({exc})") from None


def _decode_process(record: dict[str, Any]) -> ProcessFacts:
    _require_number(record, "start_time", PROCESS_KIND)
    if type(record.get("pid")) is not int:
        raise _BadItem(f"{PROCESS_KIND} record without an integer 'pid'")
    _checked(_PROCESS_CHECK, record, PROCESS_KIND)
    try:
        return ProcessFacts.from_record(record)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise _BadItem(f"{PROCESS_KIND} record with bad fields ({exc})") from None


_DECODERS: dict[str, Callable[[dict[str, Any]], Item]] = {
    kind: _event_decoder(cls) for kind, cls in EVENT_TYPES.items()
}
_DECODERS[SNAPSHOT_KIND] = _decode_snapshot
_DECODERS[PROCESS_KIND] = _decode_process


def item_from_record(record: object) -> Item:
    """Rebuild an item from its stored map; raises ValueError for anything else."""
    try:
        return _decode_item(record)
    except _BadItem as exc:
        raise ValueError(str(exc)) from None


def _decode_item(record: object) -> Item:
    if type(record) is not dict:
        raise _BadItem(f"a {type(record).__name__} where a record map belongs")
    kind = record.get("kind")
    decoder = _DECODERS.get(kind) if type(kind) is str else None
    if decoder is None:
        shown = repr(kind)[:60] if kind is not None else "none"
        raise _BadItem(f"unknown record kind {shown}")
    return decoder(record)


# --- reading -------------------------------------------------------------------------


def _new_unpacker() -> msgpack.Unpacker:
    return msgpack.Unpacker(
        raw=False,
        strict_map_key=False,
        unicode_errors=_UNICODE_ERRORS,
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

    def _skip(self, offset: int, exc: _BadItem) -> None:
        """A record that unpacked but is not valid: remember it with its index, go on with the next."""
        self.bad.append(f"item {self.records + 1} at byte {offset} is not a valid record ({exc})")

    def _unusual_record(self, offset: int, record: object) -> None:
        """Accept the end marker; anything else without a known kind is a bad item."""
        if type(record) is dict and record.get("kind") == END_KIND:
            self._end_marker(offset, record)
            return
        try:
            _decode_item(record)
        except _BadItem as exc:
            self._skip(offset, exc)
            return
        self._skip(offset, _BadItem("record the reader could not dispatch"))

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
        decoders = _DECODERS
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
                except _BadItem as exc:
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
