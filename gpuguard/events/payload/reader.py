"""The shared reader of every payload decoder: limits, value hygiene and a bounds-checked byte cursor.

Every decoder in this package reads hostile bytes through :class:`Reader` (which
raises :class:`Truncated` instead of reading past the end) and copies strings into
``detail`` through :func:`text` / :func:`decode`, so values stay bounded and
msgpack/JSON safe whatever the input.
"""

from __future__ import annotations

from typing import Any

Detail = dict[str, Any]
Result = tuple[str, Detail]  # what the package returns: (protocol, detail)
# What a decoder returns: (protocol, detail, rest), rest being what a proxy request tunnels
# (b"" for all else); dispatch follows it
Decoded = tuple[str, Detail, bytes]

MAX_SCAN = 8192  # bytes looked at; the sensor captures far less
MAX_TEXT = 200  # characters kept of any string in detail
MAX_LIST = 32  # entries kept of any list in detail
MAX_CHUNKS = 16  # writes joined by recognise_stream
MAX_DEPTH = 4  # tunnels inside tunnels followed (SOCKS in SOCKS in ...)
MAX_JSON_LINES = 16


def text(value: object) -> str | None:
    """A bounded, msgpack-safe copy of a string from the payload, else None."""
    if not isinstance(value, str):
        return None
    value = value[:MAX_TEXT]
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates, e.g. from a JSON "\ud800" escape
        value = value.encode("utf-8", "backslashreplace").decode("utf-8")[:MAX_TEXT]
    return value


def text_list(values: object) -> list[str] | None:
    if not isinstance(values, list):
        return None
    out = [t for t in (text(v) for v in values[:MAX_LIST]) if t is not None]
    return out


def decode(raw: bytes) -> str:
    return raw[: MAX_TEXT * 4].decode("utf-8", "backslashreplace")[:MAX_TEXT]


def printable_ascii(raw: bytes) -> bool:
    return all(0x21 <= b <= 0x7E for b in raw)


class Truncated(Exception):
    """The buffer ended inside a structure."""


class Reader:
    """Big-endian cursor over a byte string that raises Truncated past its end."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes, pos: int = 0) -> None:
        self.buf = buf
        self.pos = pos

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.buf):
            raise Truncated
        out = self.buf[self.pos : end]
        self.pos = end
        return out

    def u8(self) -> int:
        return self.take(1)[0]

    def u16(self) -> int:
        return int.from_bytes(self.take(2), "big")

    def u16le(self) -> int:
        return int.from_bytes(self.take(2), "little")

    def u32le(self) -> int:
        return int.from_bytes(self.take(4), "little")

    def remaining(self) -> int:
        return len(self.buf) - self.pos
