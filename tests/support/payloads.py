"""What miners write to their pools (logins, stratum, SV2, TLS hellos, SOCKS5), built from the formats."""

from __future__ import annotations

import ipaddress
import json
import ssl

import msgpack
import pytest

from gpuguard.events.payload import MAX_TEXT

PROTOCOLS = {
    "stratum",
    "cryptonote",
    "ethproxy",
    "stratum-v2",
    "tls",
    "http",
    "socks5",
    "socks4",
    "unknown",
}


WALLET = "48edfHu7V9Z84YzzMa6fUueoELZ9ZRXq9VetWzYGzKt52XU5xvqgzYnDK9URnRoJMk1j8nLwEVsaSWJ4fhdUyZijBGUicoD"


ALGOS = ["cn/1", "cn/2", "cn/r", "rx/0", "rx/wow", "rx/arq", "argon2/chukwa", "ghostrider"]
XMRIG_AGENT = "XMRig/6.21.0 (Linux x86_64) libuv/1.44.2 gcc/11.4.0"


def json_line(obj: dict) -> bytes:
    # XMRig and most miners write compact JSON, one message per line.
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


def xmrig_login(agent: str = XMRIG_AGENT, login: str = WALLET) -> bytes:
    return json_line(
        {
            "id": 1,
            "jsonrpc": "2.0",
            "method": "login",
            "params": {
                "login": login,
                "pass": "x",
                "agent": agent,
                "rigid": "rig-7",
                "algo": ALGOS,
            },
        }
    )


def stratum(method: str, params: list, msg_id: int = 1) -> bytes:
    return json.dumps({"id": msg_id, "method": method, "params": params}).encode() + b"\n"


def tls_client_hello(server_hostname: str | None, alpn: list[str] | None = None) -> bytes:
    """The real first bytes Python's TLS client writes (no network involved)."""
    context = ssl.create_default_context()
    if server_hostname is None:
        context.check_hostname = False
    if alpn:
        context.set_alpn_protocols(alpn)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=server_hostname)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def sv2_str(text: str) -> bytes:
    raw = text.encode()
    return bytes([len(raw)]) + raw


def sv2_setup_connection(
    protocol: int = 0,
    min_version: int = 2,
    max_version: int = 2,
    flags: int = 1,
    host: str = "pool.example.net",
    port: int = 34254,
) -> bytes:
    body = (
        bytes([protocol])
        + min_version.to_bytes(2, "little")
        + max_version.to_bytes(2, "little")
        + flags.to_bytes(4, "little")
        + sv2_str(host)
        + port.to_bytes(2, "little")
        + sv2_str("Bitmain")
        + sv2_str("S19 Pro")
        + sv2_str("braiins-os-23.03")
        + sv2_str("rig-7")
    )
    return b"\x00\x00" + b"\x00" + len(body).to_bytes(3, "little") + body


def socks5_connect(host: str, port: int) -> bytes:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return b"\x05\x01\x00\x03" + bytes([len(host)]) + host.encode() + port.to_bytes(2, "big")
    atyp = b"\x01" if address.version == 4 else b"\x04"
    return b"\x05\x01\x00" + atyp + address.packed + port.to_bytes(2, "big")


def assert_well_formed(result: tuple) -> None:
    """Any input gives (known protocol, JSON- and msgpack-safe bounded detail)."""
    protocol, detail = result
    assert protocol in PROTOCOLS
    assert isinstance(detail, dict)
    assert "decode_error" not in detail, detail
    json.dumps(detail, ensure_ascii=False).encode("utf-8")
    msgpack.packb(detail, use_bin_type=True)

    def check(value: object) -> None:
        if isinstance(value, str):
            assert len(value) <= MAX_TEXT
        elif isinstance(value, list):
            for item in value:
                assert isinstance(item, str)
                check(item)
        else:
            assert isinstance(value, (int, bool)), value

    for key, value in detail.items():
        assert isinstance(key, str)
        check(value)


# A Monero login, as an XMRig agent sends it (one line)
LOGIN = (
    json.dumps(
        {
            "id": 1,
            "jsonrpc": "2.0",
            "method": "login",
            "params": {"login": "4" + "7" * 94, "pass": "x", "agent": "XMRig/6.21.0"},
        }
    )
    + "\n"
).encode()
