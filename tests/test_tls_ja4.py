"""JA4 fingerprints of ClientHellos (events.payload.tls): the spec's own examples, and real
clients (Python's ssl, ``openssl s_client``, curl) caught on a loopback listener."""

from __future__ import annotations

import hashlib
import shutil
import socket
import ssl
import struct
import subprocess
import threading

import pytest

from gpuguard.events.payload import recognise_payload

CAPTURE = 512  # GG_PAYLOAD_LEN: what the sensor keeps of one write
GREASE = 0x3A3A

# FoxIO's JA4 example (technical_details/JA4.md): the sorted lists behind its hashes.
SPEC_CIPHERS = "002f,0035,009c,009d,1301,1302,1303,c013,c014,c02b,c02c,c02f,c030,cca8,cca9"
SPEC_EXTENSIONS = "0005,000a,000b,000d,0012,0015,0017,001b,0023,002b,002d,0033,4469,ff01"
SPEC_SIGNATURES = "0403,0804,0401,0503,0805,0501,0806,0601"
# Chrome as a public fingerprinting service saw it (ja4_ro: the order on the wire).
CHROME_CIPHERS = "1301,1302,1303,c02b,c02f,c02c,c030,cca9,cca8,c013,c014,009c,009d,002f,0035"
CHROME_EXTENSIONS = (
    "002d,0033,0010,fe0d,0017,44cd,0000,000b,000a,002b,ff01,0023,0012,0005,000d,001b"
)


def _u16s(text: str) -> list[int]:
    return [int(v, 16) for v in text.split(",")]


def _ext(kind: int, body: bytes) -> bytes:
    return struct.pack("!HH", kind, len(body)) + body


def build_hello(
    ciphers: list[int], extensions: list[int], signatures: list[int], sni: str | None, alpn: list
) -> bytes:
    """A TLS 1.3 ClientHello record with these lists, in this order (the extension bodies that
    JA4 reads are real; the others are empty)."""
    parts = []
    for kind in extensions:
        if kind == 0x0000:
            name = sni.encode()
            entry = b"\x00" + struct.pack("!H", len(name)) + name
            parts.append(_ext(kind, struct.pack("!H", len(entry)) + entry))
        elif kind == 0x0010:
            names = b"".join(bytes([len(a)]) + a.encode("latin-1") for a in alpn)
            parts.append(_ext(kind, struct.pack("!H", len(names)) + names))
        elif kind == 0x000D:
            sigs = b"".join(struct.pack("!H", s) for s in signatures)
            parts.append(_ext(kind, struct.pack("!H", len(sigs)) + sigs))
        elif kind == 0x002B:
            parts.append(_ext(kind, b"\x06" + struct.pack("!HHH", GREASE, 0x0304, 0x0303)))
        else:
            parts.append(_ext(kind, b""))
    extensions_blob = b"".join(parts)
    suites = b"".join(struct.pack("!H", c) for c in ciphers)
    body = (
        struct.pack("!H", 0x0303)
        + bytes(32)
        + b"\x20"
        + bytes(32)
        + struct.pack("!H", len(suites))
        + suites
        + b"\x01\x00"
        + struct.pack("!H", len(extensions_blob))
        + extensions_blob
    )
    handshake = b"\x01" + len(body).to_bytes(3, "big") + body
    return b"\x16\x03\x01" + struct.pack("!H", len(handshake)) + handshake


def _ja4(data: bytes) -> str | None:
    protocol, detail = recognise_payload(data)
    assert protocol == "tls", (protocol, detail)
    return detail.get("ja4")


def test_the_specs_example_gives_the_specs_fingerprint_whatever_the_order_and_grease():
    ciphers = [GREASE] + list(reversed(_u16s(SPEC_CIPHERS)))
    extensions = [GREASE, 0x0000] + list(reversed(_u16s(SPEC_EXTENSIONS))) + [0x0010, 0x1A1A]
    hello = build_hello(ciphers, extensions, _u16s(SPEC_SIGNATURES), "example.com", ["h2"])
    assert _ja4(hello) == "t13d1516h2_8daaf6152771_e5627efa2ab1"
    # the hashes are of the sorted lists
    assert hashlib.sha256(SPEC_CIPHERS.encode()).hexdigest()[:12] == "8daaf6152771"


def test_chromes_hello_gives_its_published_fingerprint():
    hello = build_hello(
        _u16s(CHROME_CIPHERS),
        _u16s(CHROME_EXTENSIONS),
        _u16s(SPEC_SIGNATURES),
        "tls.example",
        ["h2", "http/1.1"],
    )
    assert _ja4(hello) == "t13d1516h2_8daaf6152771_d8a2da3f94cd"


def test_sni_alpn_and_signature_order_change_only_their_parts():
    base = dict(
        ciphers=_u16s(SPEC_CIPHERS),
        extensions=_u16s(SPEC_EXTENSIONS),
        signatures=_u16s(SPEC_SIGNATURES),
    )
    no_sni = _ja4(build_hello(**base, sni=None, alpn=[]))
    assert no_sni.startswith("t13i151400_8daaf6152771_")  # no SNI, no ALPN: "i", "00"
    ext = [0x0010, *base["extensions"]]
    http1 = _ja4(build_hello(base["ciphers"], ext, base["signatures"], None, ["http/1.1"]))
    assert http1.startswith("t13i1515h1_") and http1[-12:] == no_sni[-12:]
    odd = _ja4(build_hello(base["ciphers"], ext, base["signatures"], None, ["\x01x\xff"]))
    assert odd.startswith("t13i15150f_")  # not alphanumeric: first and last hex digits
    swapped = list(reversed(base["signatures"]))
    other = _ja4(build_hello(base["ciphers"], base["extensions"], swapped, None, []))
    assert other[:23] == no_sni[:23] and other[-12:] != no_sni[-12:]  # signatures keep order


def test_a_capture_cut_before_the_lists_end_gives_no_fingerprint():
    hello = build_hello(
        _u16s(SPEC_CIPHERS), _u16s(SPEC_EXTENSIONS), _u16s(SPEC_SIGNATURES), None, []
    )
    assert _ja4(hello[:60]) is None  # inside the cipher list
    sigs = hello.index(struct.pack("!H", 0x000D))
    assert _ja4(hello[: sigs + 8]) is None  # inside the signature algorithms
    assert _ja4(hello[:-2]) is None  # inside the last extension's header


# -- real clients ------------------------------------------------------------------------


class _HelloCatcher:
    """Listens on 127.0.0.1 and keeps the first record of every connection (no handshake)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(10)
        self.port = self.sock.getsockname()[1]

    def catch(self, start) -> bytes:
        """Run ``start()`` (a client connecting to the port) and return what it sent first."""
        out: list[bytes] = []

        def serve() -> None:
            conn, _ = self.sock.accept()
            with conn:
                conn.settimeout(10)
                data = b""
                while len(data) < 5 or len(data) < 5 + int.from_bytes(data[3:5], "big"):
                    got = conn.recv(65536)
                    if not got:
                        break
                    data += got
                out.append(data)

        thread = threading.Thread(target=serve)
        thread.start()
        start()
        thread.join(15)
        assert out, "no client connected"
        return out[0]

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def catcher():
    c = _HelloCatcher()
    yield c
    c.close()


def _python_client(port: int, sni: str | None, alpn: list[str] | None):
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    if alpn:
        context.set_alpn_protocols(alpn)

    def start() -> None:
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        with sock:
            try:
                context.wrap_socket(sock, server_hostname=sni)
            except (OSError, ssl.SSLError):
                pass  # the catcher never answers

    return context, start


def _run(argv: list[str]) -> None:
    subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=20)


def test_pythons_ssl_fingerprint_shows_its_sni_and_alpn_and_is_stable(catcher):
    _, start = _python_client(catcher.port, None, None)
    bare = catcher.catch(start)
    _, start = _python_client(catcher.port, "pool.test", ["h2", "http/1.1"])
    named = catcher.catch(start)
    ja4_bare, ja4_named = _ja4(bare), _ja4(named)
    assert ja4_bare[:3] == ja4_named[:3] == ("t13" if ssl.HAS_TLSv1_3 else "t12")
    assert ja4_bare[3] == "i" and ja4_bare[8:10] == "00"  # no SNI, no ALPN
    assert ja4_named[3] == "d" and ja4_named[8:10] == "h2"
    assert ja4_bare[11:] == ja4_named[11:]  # same library, same settings: same hashes
    assert _ja4(bare) == _ja4(catcher.catch(_python_client(catcher.port, None, None)[1]))


def test_openssls_hellos_at_the_sensors_capture_length_keep_their_fingerprint(catcher):
    """OpenSSL pads a hello to 512 bytes with a final padding extension; the sensor keeps 512
    bytes of the 517 written, and the fingerprint needs none of the cut padding."""
    _, start = _python_client(catcher.port, "pool.test", ["h2"])
    hello = catcher.catch(start)
    assert len(hello) > CAPTURE
    protocol, detail = recognise_payload(hello[:CAPTURE])
    assert detail["truncated"] is True and detail["ja4"] == _ja4(hello)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")
def test_openssl_s_client_without_servername(catcher):
    port = catcher.port
    hello = catcher.catch(
        lambda: _run(["openssl", "s_client", "-connect", f"127.0.0.1:{port}", "-noservername"])
    )
    ja4 = _ja4(hello)
    # OpenSSL 3's default list: 31 suites, the cipher hash public JA4 databases list for it
    assert ja4.startswith("t13i31") and ja4[8:10] == "00", ja4
    assert ja4[11:23] == "e8f1e7e78f70", ja4
    alpn = catcher.catch(
        lambda: _run(
            ["openssl", "s_client", "-connect", f"127.0.0.1:{port}", "-noservername"]
            + ["-alpn", "http/1.1"]
        )
    )
    assert _ja4(alpn)[8:10] == "h1"


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_to_an_ip_literal_sends_no_sni(catcher):
    port = catcher.port
    hello = catcher.catch(lambda: _run(["curl", "-sk", "-m", "5", f"https://127.0.0.1:{port}/"]))
    ja4 = _ja4(hello)
    assert ja4[:4] == "t13i" and ja4[8:10] in ("h2", "h1"), ja4  # no SNI, ALPN present
    named = catcher.catch(
        lambda: _run(
            ["curl", "-sk", "-m", "5", "--resolve", f"pool.test:{port}:127.0.0.1"]
            + [f"https://pool.test:{port}/"]
        )
    )
    assert _ja4(named)[3] == "d" and _ja4(named)[11:] == ja4[11:]
