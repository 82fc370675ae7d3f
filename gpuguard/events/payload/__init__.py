"""Recognise the protocol in the first bytes a process sends on a new outbound connection.

The sensor captures the first writes (up to ``GG_PAYLOAD_LEN``, 512 bytes, each)
on every new outbound socket.  :func:`recognise_payload` names the protocol in
one buffer and :func:`recognise_stream` in a connection's first writes joined in
order, and both return ``(protocol, detail)``:

* ``stratum``, ``cryptonote``, ``ethproxy``: mining pool JSON-RPC (method, the
  wallet/worker a miner logs in with, its user agent).  A line cut at the
  capture limit is still recognised by its method string.
* ``stratum-v2``: a plaintext SV2 ``SetupConnection`` frame.  SV2 normally runs
  inside a Noise NX handshake whose first client message is a 64-byte
  ElligatorSwift-encoded key, an encoding designed to be indistinguishable
  from random bytes: nothing in it can be told from any other 64 random bytes,
  so it is *not* claimed as SV2 (it comes out ``unknown``).  Rules that want
  the weak hint can match a 64-byte ``unknown`` first write to a pool port.
* ``tls`` (ClientHello: SNI, ALPN, version; later TLS records by ``record`` type), ``http`` (request line, Host,
  User-Agent; ``CONNECT`` reveals the real destination behind an HTTP proxy),
  ``socks5`` and ``socks4`` (the proxied destination).  What is tunnelled after
  a SOCKS request or HTTP CONNECT is recognised in turn and reported as
  ``inner_protocol`` plus the inner detail keys prefixed with ``inner_``.
* ``unknown`` with ``{}`` for everything else.

The bytes are chosen by whoever runs the process, so every decoder here treats
them as hostile: any input gives a result, never an exception; detail values
are plain JSON/msgpack-safe values (str, int, bool, lists of str), strings are
cut to :data:`MAX_TEXT` characters and never carry lone surrogates.  Escaping
for display happens at output, not here.  Passwords sent to pools or proxies
are never copied into ``detail``.

One module per protocol family around the shared reader (``reader``):
``tls``, ``socks``, ``http``, ``mining`` (stratum, CryptoNote, ETHPROXY,
Stratum V2); ``dispatch`` picks the decoder by the first byte.

May import: ``gpuguard.errors``, ``gpuguard.escape`` and ``gpuguard.events``
only (it is part of the events layer; tests/test_layers.py).
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
