"""Which decoder reads a buffer, by its first byte, and how tunnelled bytes are followed.

Proxies (SOCKS, HTTP CONNECT) call :func:`add_inner` for what follows their
request; the depth is bounded by :data:`~gpuguard.events.payload.reader.MAX_DEPTH`.
"""

from __future__ import annotations

from gpuguard.events.payload import http, mining, socks, tls
from gpuguard.events.payload.reader import MAX_DEPTH, Detail, Result

_JSON_FIRST = frozenset(b"{ \t\r\n")


def recognise(data: bytes, depth: int) -> Result:
    if not data:
        return "unknown", {}
    first = data[0]
    if first in tls.RECORD_TYPES:
        result = tls.recognise_tls(data)
    elif first == 0x05:
        result = socks.recognise_socks5(data, depth)
    elif first == 0x04:
        result = socks.recognise_socks4(data, depth)
    elif first == 0x00:
        result = mining.recognise_stratum_v2(data)
    elif first in _JSON_FIRST:
        result = mining.recognise_json_rpc(data)
    elif 0x41 <= first <= 0x5A:
        result = http.recognise_http(data, depth)
    else:
        result = None
    return result if result is not None else ("unknown", {})


def add_inner(detail: Detail, rest: bytes, depth: int) -> None:
    """Recognise what a proxy request is followed by and merge it as ``inner_*``."""
    if not rest:
        return
    if depth + 1 >= MAX_DEPTH:
        detail["inner_protocol"] = "unknown"
        return
    protocol, inner = recognise(rest, depth + 1)
    detail["inner_protocol"] = protocol
    for key, value in inner.items():
        detail[f"inner_{key}"] = value
