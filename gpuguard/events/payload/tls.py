"""TLS: a client's first bytes are a handshake record holding a ClientHello (SNI, ALPN, version).

Writes that follow on the same connection are TLS records too (change cipher
spec, alerts, encrypted handshake and application data): they are named ``tls``
with the record type, not ``unknown``.
"""

from __future__ import annotations

from gpuguard.events.payload.reader import MAX_LIST, Detail, Reader, Result, Truncated, decode

_TLS_VERSIONS = {
    0x0300: "SSL 3.0",
    0x0301: "TLS 1.0",
    0x0302: "TLS 1.1",
    0x0303: "TLS 1.2",
    0x0304: "TLS 1.3",
}
_TLS_MAX_RECORD = (1 << 14) + 2048
_EXT_SERVER_NAME, _EXT_ALPN, _EXT_SUPPORTED_VERSIONS = 0x0000, 0x0010, 0x002B


def _tls_version_name(version: int) -> str:
    return _TLS_VERSIONS.get(version, f"0x{version:04x}")


# Record content types (RFC 8446 5.1); a client's first record is a handshake.
RECORD_TYPES = {
    0x14: "change_cipher_spec",
    0x15: "alert",
    0x16: "handshake",
    0x17: "application_data",
}
_HANDSHAKE, _CLIENT_HELLO = 0x16, 0x01


def recognise_tls(data: bytes) -> Result | None:
    if len(data) < 3 or data[0] not in RECORD_TYPES or data[1] != 0x03 or data[2] > 0x04:
        return None
    if data[0] == _HANDSHAKE:
        if len(data) < 6:
            return "tls", {"truncated": True}
        if data[5] == _CLIENT_HELLO:
            return _client_hello(data)
    return _later_record(data)


# Handshake messages a client sends after its hello (certificate, certificate_verify,
# client_key_exchange, finished); a ServerHello (2) is never a client's.
_CLIENT_HANDSHAKES = frozenset({11, 15, 16, 20})


def _later_record(data: bytes) -> Result | None:
    """A record that follows the ClientHello on the same connection (the hello was cut or sent earlier)."""
    if len(data) < 5 or not 1 <= int.from_bytes(data[3:5], "big") <= _TLS_MAX_RECORD:
        return None
    if data[0] == _HANDSHAKE and (len(data) < 6 or data[5] not in _CLIENT_HANDSHAKES):
        return None
    return "tls", {"record": RECORD_TYPES[data[0]]}


def _client_hello(data: bytes) -> Result | None:
    # A client's first TLS bytes are a handshake record holding a ClientHello.
    record_len = int.from_bytes(data[3:5], "big")
    if not 4 <= record_len <= _TLS_MAX_RECORD:
        return None
    body = data[5 : 5 + record_len]
    complete = len(data) >= 5 + record_len
    detail: Detail = {}
    reader = Reader(body, 4)  # handshake type and 24-bit length
    try:
        detail["version"] = _tls_version_name(reader.u16())
        reader.take(32)  # random
        reader.take(reader.u8())  # legacy session id
        reader.take(reader.u16())  # cipher suites
        reader.take(reader.u8())  # compression methods
        # Slice rather than take: a capture cut inside the extensions still
        # yields the ones before the cut (SNI usually comes early).
        extensions_len = reader.u16()
        extensions = Reader(body[reader.pos : reader.pos + extensions_len])
        if complete and extensions.remaining() < extensions_len:
            raise Truncated  # declared longer than the record that holds it
        while extensions.remaining() >= 4:
            ext_type = extensions.u16()
            ext = Reader(extensions.take(extensions.u16()))
            if ext_type == _EXT_SERVER_NAME:
                _tls_sni(ext, detail)
            elif ext_type == _EXT_ALPN:
                _tls_alpn(ext, detail)
            elif ext_type == _EXT_SUPPORTED_VERSIONS:
                _tls_supported_versions(ext, detail)
    except Truncated:
        if complete:
            detail["malformed"] = True  # lengths point past a record that is all there
    if not complete:
        detail["truncated"] = True
    return "tls", detail


def _tls_sni(ext: Reader, detail: Detail) -> None:
    names = Reader(ext.take(ext.u16()))
    while names.remaining() >= 3:
        name_type = names.u8()
        name = names.take(names.u16())
        if name_type == 0:
            detail["sni"] = decode(name)
            return


def _tls_alpn(ext: Reader, detail: Detail) -> None:
    protocols = Reader(ext.take(ext.u16()))
    out: list[str] = []
    while protocols.remaining() >= 1 and len(out) < MAX_LIST:
        out.append(decode(protocols.take(protocols.u8())))
    detail["alpn"] = out


def _tls_supported_versions(ext: Reader, detail: Detail) -> None:
    versions = Reader(ext.take(ext.u8()))
    best = 0
    while versions.remaining() >= 2:
        version = versions.u16()
        if version & 0x0F0F != 0x0A0A and version > best:  # skip GREASE values
            best = version
    if best:
        detail["version"] = _tls_version_name(best)
