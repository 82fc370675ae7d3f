"""Recognise the protocol in the first bytes a process sends on a new outbound connection.

The sensor captures the first writes (up to ``GG_PAYLOAD_LEN``, 512 bytes, each)
on every new outbound socket.  :func:`recognise_payload` names the protocol in
one buffer and :func:`recognise_stream` in a connection's first writes joined in
order, and both return ``(protocol, detail)``.  The bytes are hostile: any input gives a
result, never an exception; details are bounded plain values; passwords are never copied.

May import: ``gpuguard.errors``, ``gpuguard.escape`` and ``gpuguard.events``
only (it is part of the events layer; tests/test_layers.py).

Details (the protocols and their detail keys): docs/internals.md, "payload".
"""

from __future__ import annotations

from gpuguard.events.payload import dispatch
from gpuguard.events.payload.reader import (  # noqa: F401 - the package's limits, re-exported
    MAX_CHUNKS,
    MAX_DEPTH,
    MAX_JSON_LINES,
    MAX_LIST,
    MAX_SCAN,
    MAX_TEXT,
    Detail,
    Result,
)


def recognise_payload(data: bytes) -> Result:
    """``(protocol, detail)`` for the first bytes written on a connection."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        return "unknown", {}
    return _guarded(bytes(data[:MAX_SCAN]))


def recognise_stream(chunks: list[bytes]) -> Result:
    """``(protocol, detail)`` for a connection's first writes, in order.

    The writes are joined, so a SOCKS5 greeting, its CONNECT request and what is
    tunnelled after it may each arrive in their own write.  Pass contiguous
    writes only: a write the sensor cut short should be the last one passed.
    """
    if not isinstance(chunks, (list, tuple)):
        return "unknown", {}
    parts: list[bytes] = []
    size = 0
    for chunk in chunks[:MAX_CHUNKS]:
        if isinstance(chunk, (bytes, bytearray, memoryview)) and size < MAX_SCAN:
            part = bytes(chunk[: MAX_SCAN - size])
            parts.append(part)
            size += len(part)
    return _guarded(b"".join(parts))


def _guarded(data: bytes) -> Result:
    try:
        return dispatch.recognise(data, 0)
    except Exception as exc:  # noqa: BLE001 - last line of defence, see below
        # The decoders are written not to raise on any input and the tests feed
        # them random and truncated bytes; should one still fail, the sensor must
        # keep running, and the failure stays visible in the event.
        return "unknown", {"decode_error": type(exc).__name__}
