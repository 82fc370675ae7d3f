"""TLS: a client's first bytes are a handshake record holding a ClientHello (SNI, ALPN, version, JA4).

The ClientHello also gives the client's JA4 fingerprint (FoxIO's JA4 for TLS over TCP):
``t13d1516h2_8daaf6152771_e5627efa2ab1`` is the version offered, SNI present (``d``) or not
(``i``), the counts of cipher suites and extensions, the first and last characters of the
first ALPN value (``00``: no ALPN), then 12 hex digits of the SHA-256 of the sorted cipher
list and of the sorted extension list (SNI and ALPN left out) followed by the signature
algorithms in their order; GREASE values are ignored everywhere.  It names the TLS library
and its settings, not the payload.  A capture cut inside the last extension still gives it
when that extension's content is not needed (OpenSSL pads its hellos to 512 bytes with a
final padding extension, longer than the sensor's 512-byte capture with its record header).

Writes that follow on the same connection are TLS records too (change cipher
spec, alerts, encrypted handshake and application data): they are named ``tls``
with the record type, not ``unknown``.
"""

from __future__ import annotations

import hashlib

from gpuguard.events.payload.reader import MAX_LIST, Decoded, Detail, Reader, Truncated, decode

_TLS_VERSIONS = {
    0x0300: "SSL 3.0",
    0x0301: "TLS 1.0",
    0x0302: "TLS 1.1",
    0x0303: "TLS 1.2",
    0x0304: "TLS 1.3",
}
_TLS_MAX_RECORD = (1 << 14) + 2048
_EXT_SERVER_NAME, _EXT_ALPN, _EXT_SUPPORTED_VERSIONS = 0x0000, 0x0010, 0x002B
_EXT_SIGNATURE_ALGORITHMS = 0x000D
# extensions whose content JA4 reads (the others count by their type alone)
_JA4_CONTENT = frozenset({_EXT_ALPN, _EXT_SUPPORTED_VERSIONS, _EXT_SIGNATURE_ALGORITHMS})
_JA4_VERSIONS = {0x0304: "13", 0x0303: "12", 0x0302: "11", 0x0301: "10", 0x0300: "s3"}
_JA4_VERSIONS |= {0x0200: "s2", 0xFEFF: "d1", 0xFEFD: "d2", 0xFEFC: "d3"}


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


def recognise_tls(data: bytes) -> Decoded | None:
    if len(data) < 3 or data[0] not in RECORD_TYPES or data[1] != 0x03 or data[2] > 0x04:
        return None
    if data[0] == _HANDSHAKE:
        if len(data) < 6:
            return "tls", {"truncated": True}, b""
        if data[5] == _CLIENT_HELLO:
            return _client_hello(data)
    return _later_record(data)


# Handshake messages a client sends after its hello (certificate, certificate_verify,
# client_key_exchange, finished); a ServerHello (2) is never a client's.
_CLIENT_HANDSHAKES = frozenset({11, 15, 16, 20})


def _later_record(data: bytes) -> Decoded | None:
    """A record that follows the ClientHello on the same connection (the hello was cut or sent earlier)."""
    if len(data) < 5 or not 1 <= int.from_bytes(data[3:5], "big") <= _TLS_MAX_RECORD:
        return None
    if data[0] == _HANDSHAKE and (len(data) < 6 or data[5] not in _CLIENT_HANDSHAKES):
        return None
    return "tls", {"record": RECORD_TYPES[data[0]]}, b""


def _client_hello(data: bytes) -> Decoded | None:
    # A client's first TLS bytes are a handshake record holding a ClientHello.
    record_len = int.from_bytes(data[3:5], "big")
    if not 4 <= record_len <= _TLS_MAX_RECORD:
        return None
    body = data[5 : 5 + record_len]
    complete = len(data) >= 5 + record_len
    detail: Detail = {}
    hello = _Hello()
    reader = Reader(body, 4)  # handshake type and 24-bit length
    try:
        hello.legacy_version = reader.u16()
        detail["version"] = _tls_version_name(hello.legacy_version)
        reader.take(32)  # random
        reader.take(reader.u8())  # legacy session id
        suites = Reader(reader.take(reader.u16()))
        while suites.remaining() >= 2:
            hello.ciphers.append(suites.u16())
        reader.take(reader.u8())  # compression methods
        # Slice rather than take: a capture cut inside the extensions still
        # yields the ones before the cut (SNI usually comes early).
        extensions_len = reader.u16()
        extensions = Reader(body[reader.pos : reader.pos + extensions_len])
        if complete and extensions.remaining() < extensions_len:
            raise Truncated  # declared longer than the record that holds it
        while extensions.remaining() >= 4:
            ext_type = extensions.u16()
            ext_len = extensions.u16()
            hello.extensions.append(ext_type)
            if extensions.remaining() < ext_len:
                # cut inside its content: the type list is whole only when this one was the
                # last and JA4 does not read its content
                hello.listed = (
                    extensions.pos + ext_len == extensions_len and ext_type not in _JA4_CONTENT
                )
                raise Truncated
            ext = Reader(extensions.take(ext_len))
            if ext_type == _EXT_SERVER_NAME:
                _tls_sni(ext, detail)
            elif ext_type == _EXT_ALPN:
                hello.alpn_first = _tls_alpn(ext, detail)
            elif ext_type == _EXT_SUPPORTED_VERSIONS:
                hello.versions = _tls_supported_versions(ext, detail)
            elif ext_type == _EXT_SIGNATURE_ALGORITHMS:
                hello.signatures = _signature_algorithms(ext)
        hello.listed = extensions.pos == extensions_len
    except Truncated:
        if complete:
            detail["malformed"] = True  # lengths point past a record that is all there
            hello.listed = False
    if not complete:
        detail["truncated"] = True
    if hello.listed:
        detail["ja4"] = hello.ja4()
    return "tls", detail, b""


def _grease(value: int) -> bool:
    return value & 0x0F0F == 0x0A0A and value >> 8 == value & 0xFF


class _Hello:
    """What JA4 reads of a ClientHello, in the order the client sent it."""

    __slots__ = (
        "legacy_version",
        "ciphers",
        "extensions",
        "signatures",
        "versions",
        "alpn_first",
        "listed",
    )

    def __init__(self) -> None:
        self.legacy_version = 0
        self.ciphers: list[int] = []
        self.extensions: list[int] = []
        self.signatures: list[int] = []
        self.versions: list[int] = []
        self.alpn_first = b""  # the first ALPN value, raw
        self.listed = False  # every extension's type was read

    def ja4(self) -> str:
        """FoxIO's JA4 (TLS over TCP) of this hello."""
        versions = [v for v in self.versions if not _grease(v)]
        version = _JA4_VERSIONS.get(max(versions) if versions else self.legacy_version, "00")
        ciphers = [c for c in self.ciphers if not _grease(c)]
        extensions = [e for e in self.extensions if not _grease(e)]
        sni = "d" if _EXT_SERVER_NAME in extensions else "i"
        alpn = _ja4_alpn(self.alpn_first)
        a = f"t{version}{sni}{min(len(ciphers), 99):02d}{min(len(extensions), 99):02d}{alpn}"
        b = _ja4_hash(",".join(f"{c:04x}" for c in sorted(ciphers)))
        hashed = sorted(e for e in extensions if e not in (_EXT_SERVER_NAME, _EXT_ALPN))
        c_text = ",".join(f"{e:04x}" for e in hashed)
        signatures = [s for s in self.signatures if not _grease(s)]
        if signatures:
            c_text += "_" + ",".join(f"{s:04x}" for s in signatures)
        c = _ja4_hash(c_text) if hashed else "000000000000"
        return f"{a}_{b if ciphers else '000000000000'}_{c}"


def _ja4_hash(text: str) -> str:
    return hashlib.sha256(text.encode("ascii")).hexdigest()[:12]


def _ja4_alpn(first: bytes) -> str:
    """The first and last characters of the first ALPN value (hex digits when not alphanumeric)."""
    if not first:
        return "00"
    head, tail = first[0], first[-1]
    if chr(head).isalnum() and head < 0x80 and chr(tail).isalnum() and tail < 0x80:
        return chr(head) + chr(tail)
    return f"{head:02x}"[0] + f"{tail:02x}"[-1]


def _signature_algorithms(ext: Reader) -> list[int]:
    algorithms = Reader(ext.take(ext.u16()))
    out: list[int] = []
    while algorithms.remaining() >= 2:
        out.append(algorithms.u16())
    return out


def _tls_sni(ext: Reader, detail: Detail) -> None:
    names = Reader(ext.take(ext.u16()))
    while names.remaining() >= 3:
        name_type = names.u8()
        name = names.take(names.u16())
        if name_type == 0:
            detail["sni"] = decode(name)
            return


def _tls_alpn(ext: Reader, detail: Detail) -> bytes:
    """Sets ``alpn`` (the protocols offered); returns the first one raw (for JA4)."""
    protocols = Reader(ext.take(ext.u16()))
    out: list[str] = []
    first = b""
    while protocols.remaining() >= 1 and len(out) < MAX_LIST:
        raw = protocols.take(protocols.u8())
        first = first or raw
        out.append(decode(raw))
    detail["alpn"] = out
    return first


def _tls_supported_versions(ext: Reader, detail: Detail) -> list[int]:
    versions = Reader(ext.take(ext.u8()))
    best = 0
    offered: list[int] = []
    while versions.remaining() >= 2:
        version = versions.u16()
        offered.append(version)
        if not _grease(version) and version > best:
            best = version
    if best:
        detail["version"] = _tls_version_name(best)
    return offered
