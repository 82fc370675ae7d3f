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
* ``tls`` (ClientHello: SNI, ALPN, version), ``http`` (request line, Host,
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
"""

from __future__ import annotations

import ipaddress
import json
import re
from typing import Any

Detail = dict[str, Any]
Result = tuple[str, Detail]

MAX_SCAN = 8192   # bytes looked at; the sensor captures far less
MAX_TEXT = 200    # characters kept of any string in detail
MAX_LIST = 32     # entries kept of any list in detail
MAX_CHUNKS = 16   # writes joined by recognise_stream
MAX_DEPTH = 4     # tunnels inside tunnels followed (SOCKS in SOCKS in ...)
MAX_JSON_LINES = 16


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
        return _recognise(data, 0)
    except Exception as exc:  # noqa: BLE001 - last line of defence, see below
        # The decoders are written not to raise on any input and the tests feed
        # them random and truncated bytes; should one still fail, the sensor must
        # keep running, and the failure stays visible in the event.
        return "unknown", {"decode_error": type(exc).__name__}


def _recognise(data: bytes, depth: int) -> Result:
    if not data:
        return "unknown", {}
    first = data[0]
    if first == 0x16:
        result = _tls(data)
    elif first == 0x05:
        result = _socks5(data, depth)
    elif first == 0x04:
        result = _socks4(data, depth)
    elif first == 0x00:
        result = _stratum_v2(data)
    elif first in _JSON_FIRST:
        result = _json_rpc(data)
    elif 0x41 <= first <= 0x5A:
        result = _http(data, depth)
    else:
        result = None
    return result if result is not None else ("unknown", {})


# --- value hygiene ---------------------------------------------------------------

def _text(value: object) -> str | None:
    """A bounded, msgpack-safe copy of a string from the payload, else None."""
    if not isinstance(value, str):
        return None
    value = value[:MAX_TEXT]
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates, e.g. from a JSON "\ud800" escape
        value = value.encode("utf-8", "backslashreplace").decode("utf-8")[:MAX_TEXT]
    return value


def _text_list(values: object) -> list[str] | None:
    if not isinstance(values, list):
        return None
    out = [t for t in (_text(v) for v in values[:MAX_LIST]) if t is not None]
    return out


def _decode(raw: bytes) -> str:
    return raw[: MAX_TEXT * 4].decode("utf-8", "backslashreplace")[:MAX_TEXT]


def _printable_ascii(raw: bytes) -> bool:
    return all(0x21 <= b <= 0x7E for b in raw)


def _add_inner(detail: Detail, rest: bytes, depth: int) -> None:
    """Recognise what a proxy request is followed by and merge it as ``inner_*``."""
    if not rest:
        return
    if depth + 1 >= MAX_DEPTH:
        detail["inner_protocol"] = "unknown"
        return
    protocol, inner = _recognise(rest, depth + 1)
    detail["inner_protocol"] = protocol
    for key, value in inner.items():
        detail[f"inner_{key}"] = value


class _Truncated(Exception):
    """The buffer ended inside a structure."""


class _Reader:
    """Big-endian cursor over a byte string that raises _Truncated past its end."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes, pos: int = 0) -> None:
        self.buf = buf
        self.pos = pos

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.buf):
            raise _Truncated
        out = self.buf[self.pos:end]
        self.pos = end
        return out

    def u8(self) -> int:
        return self.take(1)[0]

    def u16(self) -> int:
        return int.from_bytes(self.take(2), "big")

    def u16le(self) -> int:
        return int.from_bytes(self.take(2), "little")

    def u24(self) -> int:
        return int.from_bytes(self.take(3), "big")

    def u32le(self) -> int:
        return int.from_bytes(self.take(4), "little")

    def remaining(self) -> int:
        return len(self.buf) - self.pos


# --- TLS ---------------------------------------------------------------------------

_TLS_VERSIONS = {0x0300: "SSL 3.0", 0x0301: "TLS 1.0", 0x0302: "TLS 1.1", 0x0303: "TLS 1.2", 0x0304: "TLS 1.3"}
_TLS_MAX_RECORD = (1 << 14) + 2048
_EXT_SERVER_NAME, _EXT_ALPN, _EXT_SUPPORTED_VERSIONS = 0x0000, 0x0010, 0x002B


def _tls_version_name(version: int) -> str:
    return _TLS_VERSIONS.get(version, f"0x{version:04x}")


def _tls(data: bytes) -> Result | None:
    # A client's first TLS bytes are a handshake record holding a ClientHello.
    if len(data) < 3 or data[1] != 0x03 or data[2] > 0x04:
        return None
    if len(data) < 6:
        return "tls", {"truncated": True}
    record_len = int.from_bytes(data[3:5], "big")
    if data[5] != 0x01 or not 4 <= record_len <= _TLS_MAX_RECORD:
        return None
    body = data[5:5 + record_len]
    complete = len(data) >= 5 + record_len
    detail: Detail = {}
    reader = _Reader(body, 4)  # handshake type and 24-bit length
    try:
        detail["version"] = _tls_version_name(reader.u16())
        reader.take(32)                      # random
        reader.take(reader.u8())             # legacy session id
        reader.take(reader.u16())            # cipher suites
        reader.take(reader.u8())             # compression methods
        # Slice rather than take: a capture cut inside the extensions still
        # yields the ones before the cut (SNI usually comes early).
        extensions_len = reader.u16()
        extensions = _Reader(body[reader.pos:reader.pos + extensions_len])
        if complete and extensions.remaining() < extensions_len:
            raise _Truncated  # declared longer than the record that holds it
        while extensions.remaining() >= 4:
            ext_type = extensions.u16()
            ext = _Reader(extensions.take(extensions.u16()))
            if ext_type == _EXT_SERVER_NAME:
                _tls_sni(ext, detail)
            elif ext_type == _EXT_ALPN:
                _tls_alpn(ext, detail)
            elif ext_type == _EXT_SUPPORTED_VERSIONS:
                _tls_supported_versions(ext, detail)
    except _Truncated:
        if complete:
            detail["malformed"] = True  # lengths point past a record that is all there
    if not complete:
        detail["truncated"] = True
    return "tls", detail


def _tls_sni(ext: _Reader, detail: Detail) -> None:
    names = _Reader(ext.take(ext.u16()))
    while names.remaining() >= 3:
        name_type = names.u8()
        name = names.take(names.u16())
        if name_type == 0:
            detail["sni"] = _decode(name)
            return


def _tls_alpn(ext: _Reader, detail: Detail) -> None:
    protocols = _Reader(ext.take(ext.u16()))
    out: list[str] = []
    while protocols.remaining() >= 1 and len(out) < MAX_LIST:
        out.append(_decode(protocols.take(protocols.u8())))
    detail["alpn"] = out


def _tls_supported_versions(ext: _Reader, detail: Detail) -> None:
    versions = _Reader(ext.take(ext.u8()))
    best = 0
    while versions.remaining() >= 2:
        version = versions.u16()
        if version & 0x0F0F != 0x0A0A and version > best:  # skip GREASE values
            best = version
    if best:
        detail["version"] = _tls_version_name(best)


# --- SOCKS ---------------------------------------------------------------------------

_SOCKS_COMMANDS = {1: "connect", 2: "bind", 3: "udp-associate"}
_SOCKS5_METHODS = {0: "none", 1: "gssapi", 2: "username"}


def _socks5_greeting(data: bytes) -> tuple[list[int], int] | None:
    if len(data) < 3 or data[0] != 5 or data[1] == 0:
        return None
    end = 2 + data[1]
    methods = list(data[2:end])
    if len(methods) < data[1]:
        return None
    # Assigned methods are 0x00-0x09 and 0x80-0xFE is private; 0xFF means "none" and
    # only a server sends it.
    if any(0x0A <= m < 0x80 or m == 0xFF for m in methods):
        return None
    return methods, end


def _socks5_request(data: bytes, pos: int) -> tuple[Detail, int] | str | None:
    """Parse a request at ``pos``: (detail, end), "truncated", or None if it is not one."""
    head = data[pos:pos + 4]
    if len(head) < 4:
        if head and (head[0] != 5 or (len(head) > 1 and head[1] not in _SOCKS_COMMANDS)):
            return None
        return "truncated"
    version, command, reserved, atyp = head
    if version != 5 or command not in _SOCKS_COMMANDS or reserved != 0 or atyp not in (1, 3, 4):
        return None
    reader = _Reader(data, pos + 4)
    try:
        if atyp == 1:
            host, kind = ".".join(str(b) for b in reader.take(4)), "ipv4"
        elif atyp == 4:
            host, kind = ipaddress.IPv6Address(reader.take(16)).compressed, "ipv6"
        else:
            name = reader.take(reader.u8())
            if not name or not _printable_ascii(name):
                return None
            host, kind = _decode(name), "domain"
        port = reader.u16()
    except _Truncated:
        return "truncated"
    detail: Detail = {
        "stage": "connect" if command == 1 else "request",
        "command": _SOCKS_COMMANDS[command],
        "address_type": kind,
        "target_host": host,
        "target_port": port,
    }
    return detail, reader.pos


def _socks5_auth(data: bytes, pos: int) -> tuple[str, int] | str | None:
    """RFC 1929 username/password: (username, end), "truncated" or None.  The password is skipped."""
    reader = _Reader(data, pos)
    try:
        if reader.u8() != 1:
            return None
        username = reader.take(reader.u8())
        reader.take(reader.u8())
    except _Truncated:
        return "truncated"
    return _decode(username), reader.pos


def _socks5(data: bytes, depth: int) -> Result | None:
    greeting = _socks5_greeting(data)
    if greeting is not None:
        result = _socks5_after_greeting(data, depth, *greeting)
        if result is not None:
            return result
    # A CONNECT request written on its own (the greeting went in an earlier write).
    request = _socks5_request(data, 0)
    if isinstance(request, tuple):
        detail, end = request
        _add_inner(detail, data[end:], depth)
        return "socks5", detail
    return None


def _socks5_after_greeting(data: bytes, depth: int, methods: list[int], pos: int) -> Result | None:
    detail: Detail = {
        "stage": "greeting",
        "methods": [_SOCKS5_METHODS.get(m, f"0x{m:02x}") for m in methods],
    }
    if pos == len(data):
        return "socks5", detail
    if data[pos] == 1 and 2 in methods:
        auth = _socks5_auth(data, pos)
        if auth is None:
            return None
        if auth == "truncated":
            detail["truncated"] = True
            return "socks5", detail
        detail["username"], pos = auth
        if pos == len(data):
            return "socks5", detail
    request = _socks5_request(data, pos)
    if request is None:
        return None
    if request == "truncated":
        detail["truncated"] = True
        return "socks5", detail
    fields, end = request
    detail.update(fields)
    _add_inner(detail, data[end:], depth)
    return "socks5", detail


def _socks4(data: bytes, depth: int) -> Result | None:
    # VN=4 CD PORT(2) IP(4) USERID NUL [HOST NUL when IP is 0.0.0.x, x != 0: SOCKS4a]
    if len(data) < 9 or data[1] not in (1, 2):
        return None
    port = int.from_bytes(data[2:4], "big")
    ip = data[4:8]
    user_end = data.find(b"\x00", 8, 8 + 256)
    if user_end < 0:
        return None
    user_id = data[8:user_end]
    if not all(0x20 <= b <= 0x7E for b in user_id):
        return None
    detail: Detail = {
        "stage": "connect" if data[1] == 1 else "request",
        "command": _SOCKS_COMMANDS[data[1]],
        "target_port": port,
    }
    end = user_end + 1
    if ip[:3] == b"\x00\x00\x00" and ip[3] != 0:
        host_end = data.find(b"\x00", end, end + 256)
        if host_end < 0:
            return None
        host = data[end:host_end]
        if not host or not _printable_ascii(host):
            return None
        detail["variant"] = "socks4a"
        detail["target_host"] = _decode(host)
        end = host_end + 1
    else:
        detail["target_host"] = ".".join(str(b) for b in ip)
    if user_id:
        detail["user_id"] = _decode(user_id)
    _add_inner(detail, data[end:], depth)
    return "socks4", detail


# --- Stratum V2 ------------------------------------------------------------------------

_SV2_SUBPROTOCOLS = {0: "mining", 1: "job-declaration", 2: "template-distribution"}
_SV2_SETUP_MIN = 1 + 2 + 2 + 4 + 1 + 2 + 1 + 1 + 1 + 1            # every string empty
_SV2_SETUP_MAX = 1 + 2 + 2 + 4 + 2 + 5 * (1 + 255)
_SV2_STRINGS = ("vendor", "hardware_version", "firmware", "device_id")


def _sv2_string(reader: _Reader) -> str | None:
    raw = reader.take(reader.u8())
    if any(b < 0x20 or b == 0x7F for b in raw):
        return None
    try:
        return _text(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return None


def _stratum_v2(data: bytes) -> Result | None:
    # Frame: extension_type u16 LE, msg_type u8, msg_length u24 LE, payload.
    # SetupConnection is extension 0, message 0x00, and opens every SV2 connection.
    if len(data) < 6 + 5 or data[0:3] != b"\x00\x00\x00":
        return None
    length = int.from_bytes(data[3:6], "little")
    if not _SV2_SETUP_MIN <= length <= _SV2_SETUP_MAX:
        return None
    payload = data[6:6 + length]
    complete = len(payload) == length
    reader = _Reader(payload)
    detail: Detail = {"message": "SetupConnection"}
    try:
        subprotocol = reader.u8()
        min_version, max_version = reader.u16le(), reader.u16le()
        if subprotocol not in _SV2_SUBPROTOCOLS or not 1 <= min_version <= max_version <= 0xFF:
            return None
        detail.update(subprotocol=_SV2_SUBPROTOCOLS[subprotocol], min_version=min_version, max_version=max_version)
        detail["flags"] = reader.u32le()
        host = _sv2_string(reader)
        if host is None:
            return None
        detail["endpoint_host"] = host
        detail["endpoint_port"] = reader.u16le()
        for key in _SV2_STRINGS:
            value = _sv2_string(reader)
            if value is None:
                return None
            detail[key] = value
    except _Truncated:
        if complete:
            return None  # the declared length disagrees with the fields
        detail["truncated"] = True
        return "stratum-v2", detail
    if reader.remaining():
        return None  # bytes left over inside the declared length
    return "stratum-v2", detail


# --- HTTP ----------------------------------------------------------------------------

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


def _http(data: bytes, depth: int) -> Result | None:
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
    detail: Detail = {"method": method, "path": _decode(target)}
    if len(request_line) == 3:
        detail["version"] = _decode(request_line[2])
    for line in lines[1:_MAX_HEADERS]:
        name, sep, value = line.rstrip(b"\r").partition(b":")
        if not sep:
            continue
        name = name.strip().lower()
        if name == b"host":
            detail["host"] = _decode(value.strip())
        elif name == b"user-agent":
            detail["user_agent"] = _decode(value.strip())
    if head_end < 0:
        detail["truncated"] = True
    if method == "CONNECT":
        detail["target"] = detail.pop("path")
        host, port = _split_host_port(detail["target"])
        detail["target_host"] = host
        if port is not None:
            detail["target_port"] = port
        if head_end >= 0:
            _add_inner(detail, data[head_end + 4:], depth)
    elif head_end >= 0:
        _add_body(detail, data[head_end + 4:])
    return "http", detail


def _add_body(detail: Detail, body: bytes) -> None:
    # Getwork-style miners (and ETHPROXY over HTTP) POST their JSON-RPC.
    if body[:1] in (b"{", b"["):
        body = body.lstrip(b"[")
        result = _json_rpc(body)
        if result is not None:
            protocol, fields = result
            detail["body_protocol"] = protocol
            if "method" in fields:
                detail["body_method"] = fields["method"]


# --- mining JSON-RPC -----------------------------------------------------------------

_JSON_FIRST = frozenset(b"{ \t\r\n")
_CRYPTONOTE_METHODS = frozenset({"login", "submit", "keepalived", "getjob"})
_ETHPROXY_METHODS = frozenset({"eth_submitLogin", "eth_getWork", "eth_submitWork", "eth_submitHashrate"})

_JSON_STR = r'"((?:[^"\\]|\\.){0,512})"'
_RE_METHOD = re.compile(r'"method"\s*:\s*' + _JSON_STR)
_RE_FIRST_PARAM = re.compile(r'"params"\s*:\s*\[\s*' + _JSON_STR)
_RE_KEY = {key: re.compile(rf'"{key}"\s*:\s*' + _JSON_STR) for key in ("login", "agent", "worker", "rigid")}
_RE_ALGO = re.compile(r'"algo"\s*:\s*\[([^\]]{0,1024})\]')
_RE_STRING = re.compile(_JSON_STR)


def _protocol_of(method: str) -> str | None:
    if method.startswith("mining."):
        return "stratum"
    if method in _CRYPTONOTE_METHODS:
        return "cryptonote"
    if method in _ETHPROXY_METHODS:
        return "ethproxy"
    return None


def _unescape(raw: str) -> str:
    try:
        value = json.loads(f'"{raw}"')
    except (ValueError, RecursionError):
        return raw
    return value if isinstance(value, str) else raw


def _loads(line: bytes) -> dict | None:
    try:
        value = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


class _Message:
    """One JSON-RPC line: fully parsed, or read leniently when cut short."""

    __slots__ = ("method", "obj", "text")

    def __init__(self, method: str, obj: dict | None, text: str) -> None:
        self.method = method
        self.obj = obj          # the parsed object, None when the line was partial
        self.text = text        # the line as text, for lenient extraction

    def params(self) -> object:
        return self.obj.get("params") if self.obj is not None else None

    def field(self, key: str) -> str | None:
        """A top-level (parsed) or anywhere-in-line (partial) string value."""
        if self.obj is not None:
            return _text(self.obj.get(key))
        match = _RE_KEY[key].search(self.text)
        return _text(_unescape(match.group(1))) if match else None

    def param_field(self, key: str) -> str | None:
        params = self.params()
        if isinstance(params, dict):
            return _text(params.get(key))
        if self.obj is None:
            match = _RE_KEY[key].search(self.text)
            return _text(_unescape(match.group(1))) if match else None
        return None

    def first_param(self) -> str | None:
        params = self.params()
        if isinstance(params, list) and params:
            return _text(params[0])
        if self.obj is None:
            match = _RE_FIRST_PARAM.search(self.text)
            return _text(_unescape(match.group(1))) if match else None
        return None


def _messages(data: bytes) -> list[_Message]:
    messages: list[_Message] = []
    for raw in data.split(b"\n", MAX_JSON_LINES)[:MAX_JSON_LINES]:
        line = raw.strip()
        if not line:
            continue
        if line[:1] != b"{":
            break
        obj = _loads(line)
        text = line.decode("utf-8", "replace")
        if obj is not None:
            method = obj.get("method")
        else:
            match = _RE_METHOD.search(text)
            method = _unescape(match.group(1)) if match else None
        if not isinstance(method, str):
            break
        messages.append(_Message(method, obj, text))
        if obj is None:
            break  # a line that does not parse is the one the capture cut
    return messages


def _json_rpc(data: bytes) -> Result | None:
    messages = _messages(data)
    if not messages:
        return None
    protocol = _protocol_of(messages[0].method)
    if protocol is None:
        return None
    detail: Detail = {"method": _text(messages[0].method)}
    if len(messages) > 1:
        detail["methods"] = [_text(m.method) for m in messages[:MAX_LIST]]
    if protocol == "stratum":
        _stratum_detail(messages, detail)
    elif protocol == "cryptonote":
        if not _cryptonote_detail(messages, detail):
            return None
    else:
        _ethproxy_detail(messages, detail)
    return protocol, {k: v for k, v in detail.items() if v is not None}


def _stratum_detail(messages: list[_Message], detail: Detail) -> None:
    for message in messages:
        if message.method == "mining.authorize" and "user" not in detail:
            detail["user"] = message.first_param()   # params[1] is the password: not kept
        elif message.method == "mining.subscribe" and "agent" not in detail:
            detail["agent"] = message.first_param()
            params = message.params()
            if isinstance(params, list) and len(params) > 1:
                version = _text(params[1])
                if version and version.startswith("EthereumStratum/"):
                    detail["protocol_version"] = version
        elif message.method == "mining.hello" and "agent" not in detail:
            detail["agent"] = message.param_field("agent")


def _cryptonote_detail(messages: list[_Message], detail: Detail) -> bool:
    first = messages[0]
    # Plain "login"/"submit" are common JSON-RPC words; the XMRig protocol always
    # passes an object as params, so a parsed line with anything else is not it.
    if first.obj is not None and not isinstance(first.params(), dict):
        return False
    for message in messages:
        if message.method == "login":
            detail["login"] = message.param_field("login")
            detail["agent"] = message.param_field("agent")
            detail["rig_id"] = message.param_field("rigid")
            detail["algo"] = _algo_list(message)
            break
    return True


def _algo_list(message: _Message) -> list[str] | None:
    params = message.params()
    if isinstance(params, dict):
        return _text_list(params.get("algo"))
    if message.obj is None:
        match = _RE_ALGO.search(message.text)
        if match:
            return [_text(_unescape(s)) or "" for s in _RE_STRING.findall(match.group(1))[:MAX_LIST]]
    return None


def _ethproxy_detail(messages: list[_Message], detail: Detail) -> None:
    for message in messages:
        if detail.get("worker") is None:
            detail["worker"] = message.field("worker")
        if message.method == "eth_submitLogin" and detail.get("login") is None:
            detail["login"] = message.first_param()
