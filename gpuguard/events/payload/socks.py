"""SOCKS5 (greeting, RFC 1929 username, CONNECT request) and SOCKS4/4a: the proxied destination.

What is tunnelled after the request is returned as ``rest`` (dispatch recognises it: ``inner_*``).
"""

from __future__ import annotations

import ipaddress

from gpuguard.events.payload.reader import (
    Decoded,
    Detail,
    Reader,
    Truncated,
    decode,
    printable_ascii,
)

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
    head = data[pos : pos + 4]
    if len(head) < 4:
        if head and (head[0] != 5 or (len(head) > 1 and head[1] not in _SOCKS_COMMANDS)):
            return None
        return "truncated"
    version, command, reserved, atyp = head
    if version != 5 or command not in _SOCKS_COMMANDS or reserved != 0 or atyp not in (1, 3, 4):
        return None
    reader = Reader(data, pos + 4)
    try:
        if atyp == 1:
            host, kind = ".".join(str(b) for b in reader.take(4)), "ipv4"
        elif atyp == 4:
            host, kind = ipaddress.IPv6Address(reader.take(16)).compressed, "ipv6"
        else:
            name = reader.take(reader.u8())
            if not name or not printable_ascii(name):
                return None
            host, kind = decode(name), "domain"
        port = reader.u16()
    except Truncated:
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
    reader = Reader(data, pos)
    try:
        if reader.u8() != 1:
            return None
        username = reader.take(reader.u8())
        reader.take(reader.u8())
    except Truncated:
        return "truncated"
    return decode(username), reader.pos


def recognise_socks5(data: bytes) -> Decoded | None:
    greeting = _socks5_greeting(data)
    if greeting is not None:
        result = _socks5_after_greeting(data, *greeting)
        if result is not None:
            return result
    # A CONNECT request written on its own (the greeting went in an earlier write).
    request = _socks5_request(data, 0)
    if isinstance(request, tuple):
        detail, end = request
        return "socks5", detail, data[end:]
    return None


def _socks5_after_greeting(data: bytes, methods: list[int], pos: int) -> Decoded | None:
    detail: Detail = {
        "stage": "greeting",
        "methods": [_SOCKS5_METHODS.get(m, f"0x{m:02x}") for m in methods],
    }
    if pos == len(data):
        return "socks5", detail, b""
    if data[pos] == 1 and 2 in methods:
        auth = _socks5_auth(data, pos)
        if auth is None:
            return None
        if auth == "truncated":
            detail["truncated"] = True
            return "socks5", detail, b""
        detail["username"], pos = auth
        if pos == len(data):
            return "socks5", detail, b""
    request = _socks5_request(data, pos)
    if request is None:
        return None
    if request == "truncated":
        detail["truncated"] = True
        return "socks5", detail, b""
    fields, end = request
    detail.update(fields)
    return "socks5", detail, data[end:]


def recognise_socks4(data: bytes) -> Decoded | None:
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
        if not host or not printable_ascii(host):
            return None
        detail["variant"] = "socks4a"
        detail["target_host"] = decode(host)
        end = host_end + 1
    else:
        detail["target_host"] = ".".join(str(b) for b in ip)
    if user_id:
        detail["user_id"] = decode(user_id)
    return "socks4", detail, data[end:]
