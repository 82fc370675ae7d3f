"""Which decoder reads a buffer, by its first byte, and how tunnelled bytes are followed.

Each decoder returns ``(protocol, detail, rest)`` or None: ``rest`` is what a proxy
request (SOCKS, HTTP CONNECT) is followed by, recognised here in turn and merged as
``inner_*``; the depth is bounded by :data:`~gpuguard.events.payload.reader.MAX_DEPTH`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpuguard.events.payload import http, mining, socks, tls
from gpuguard.events.payload.reader import MAX_DEPTH, Decoded, Detail, Result


@dataclass(frozen=True, slots=True)
class Decoder:
    """A decoder and the first bytes of what it reads (no two decoders share a first byte)."""

    name: str
    first_bytes: frozenset[int]
    read: Callable[[bytes], Decoded | None]


DECODERS: tuple[Decoder, ...] = (
    Decoder("tls", frozenset(tls.RECORD_TYPES), tls.recognise_tls),
    Decoder("socks5", frozenset({0x05}), socks.recognise_socks5),
    Decoder("socks4", frozenset({0x04}), socks.recognise_socks4),
    Decoder("stratum-v2", frozenset({0x00}), mining.recognise_stratum_v2),
    Decoder("json-rpc", frozenset(b"{ \t\r\n"), mining.recognise_json_rpc),
    Decoder("http", frozenset(range(0x41, 0x5B)), http.recognise_http),
)


def recognise(data: bytes, depth: int = 0) -> Result:
    """``(protocol, detail)`` of ``data``, what a proxy tunnels followed down to ``MAX_DEPTH``."""
    decoded = None
    if data:
        for decoder in DECODERS:
            if data[0] in decoder.first_bytes:
                decoded = decoder.read(data)
                break
    if decoded is None:
        return "unknown", {}
    protocol, detail, rest = decoded
    if rest:
        _add_inner(detail, rest, depth)
    return protocol, detail


def _add_inner(detail: Detail, rest: bytes, depth: int) -> None:
    """Recognise what a proxy request is followed by and merge it as ``inner_*``."""
    if depth + 1 >= MAX_DEPTH:
        detail["inner_protocol"] = "unknown"
        return
    protocol, inner = recognise(rest, depth + 1)
    detail["inner_protocol"] = protocol
    for key, value in inner.items():
        detail[f"inner_{key}"] = value
