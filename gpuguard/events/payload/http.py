"""HTTP requests: request line, Host and User-Agent; CONNECT reveals the destination behind a proxy.

A CONNECT's tunnelled bytes are returned as ``rest`` (dispatch recognises them:
``inner_*``); a POSTed JSON-RPC body (getwork miners) is named as ``body_protocol``.
"""

from __future__ import annotations

from gpuguard.events.payload.mining import recognise_json_rpc
from gpuguard.events.payload.reader import Decoded, Detail, decode

_HTTP_METHODS = frozenset(
    {b"GET", b"POST", b"PUT", b"HEAD", b"DELETE", b"OPTIONS", b"PATCH", b"CONNECT", b"TRACE"}
)
_MAX_HEADERS = 100


def _split_host_port(target: str) -> tuple[str, int | None]:
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit() or len(port) > 5 or int(port) > 65535:
        return target, None
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def recognise_http(data: bytes) -> Decoded | None:
    space = data.find(b" ", 0, 8)
    if space < 0 or data[:space] not in _HTTP_METHODS:
        return None
    head_end = data.find(b"\r\n\r\n")
    head = data if head_end < 0 else data[:head_end]
    lines = head.split(b"\n")
    request_line = lines[0].rstrip(b"\r").split(b" ")
    target = request_line[1] if len(request_line) > 1 else b""
    if len(lines) > 1 or head_end >= 0:
        # The request line is complete: it must end in an HTTP version.
        if len(request_line) != 3 or not request_line[2].startswith(b"HTTP/"):
            return None
    if any(b <= 0x20 or b == 0x7F for b in target):
        return None
    method = data[:space].decode("ascii")
    detail: Detail = {"method": method, "path": decode(target)}
    if len(request_line) == 3:
        detail["version"] = decode(request_line[2])
    for line in lines[1:_MAX_HEADERS]:
        name, sep, value = line.rstrip(b"\r").partition(b":")
        if not sep:
            continue
        name = name.strip().lower()
        if name == b"host":
            detail["host"] = decode(value.strip())
        elif name == b"user-agent":
            detail["user_agent"] = decode(value.strip())
    if head_end < 0:
        detail["truncated"] = True
    rest = b""
    if method == "CONNECT":
        detail["target"] = detail.pop("path")
        host, port = _split_host_port(detail["target"])
        detail["target_host"] = host
        if port is not None:
            detail["target_port"] = port
        if head_end >= 0:
            rest = data[head_end + 4 :]  # what the tunnel carries
    elif head_end >= 0:
        _add_body(detail, data[head_end + 4 :])
    return "http", detail, rest


def _add_body(detail: Detail, body: bytes) -> None:
    # Getwork-style miners (and ETHPROXY over HTTP) POST their JSON-RPC.
    if body[:1] in (b"{", b"["):
        body = body.lstrip(b"[")
        result = recognise_json_rpc(body)
        if result is not None:
            protocol, fields, _ = result
            detail["body_protocol"] = protocol
            if "method" in fields:
                detail["body_method"] = fields["method"]
