"""Protocol recognition of the first bytes on outbound connections (events.payload)."""

from __future__ import annotations

import json
import random
import socket
import ssl
from dataclasses import replace

import pytest

from gpuguard.events import payload
from gpuguard.events.payload import dispatch, recognise_payload, recognise_stream
from tests.support.payloads import (
    ALGOS,
    WALLET,
    XMRIG_AGENT,
    assert_well_formed,
    json_line,
    socks5_connect,
    stratum,
    sv2_setup_connection,
    tls_client_hello,
    xmrig_login,
)

CAPTURE = 512  # GG_PAYLOAD_LEN: what the sensor keeps of one write


# --- samples built from the protocol formats --------------------------------------


# --- CryptoNote / XMRig ----------------------------------------------------------


def test_xmrig_login_gives_wallet_agent_and_algorithms():
    protocol, detail = recognise_payload(xmrig_login())
    assert protocol == "cryptonote"
    assert detail == {
        "method": "login",
        "login": WALLET,
        "agent": XMRIG_AGENT,
        "rig_id": "rig-7",
        "algo": ALGOS,
    }
    assert "x" not in detail.values()  # the pool password is not copied


def test_xmrig_login_cut_at_the_capture_limit_is_still_recognised():
    long_agent = XMRIG_AGENT + " " + "A" * 400
    line = xmrig_login(agent=long_agent)
    assert len(line) > CAPTURE
    protocol, detail = recognise_payload(line[:CAPTURE])
    assert protocol == "cryptonote"
    assert detail["method"] == "login"
    assert detail["login"] == WALLET
    assert "agent" not in detail  # its closing quote lies past the cut


def test_login_cut_right_after_the_method_string():
    line = xmrig_login()
    cut = line.index(b'"params"') + 3
    assert recognise_payload(line[:cut]) == ("cryptonote", {"method": "login"})


@pytest.mark.parametrize(
    "method, params",
    [
        ("submit", {"id": "a1", "job_id": "j7", "nonce": "deadbeef", "result": "00" * 32}),
        ("keepalived", {"id": "a1"}),
        ("getjob", {"id": "a1"}),
    ],
)
def test_other_cryptonote_client_messages(method, params):
    protocol, detail = recognise_payload(
        json_line({"id": 4, "jsonrpc": "2.0", "method": method, "params": params})
    )
    assert (protocol, detail) == ("cryptonote", {"method": method})


def test_generic_json_rpc_login_with_list_params_is_not_cryptonote():
    assert recognise_payload(
        json_line({"id": 1, "method": "login", "params": ["admin", "pw"]})
    ) == ("unknown", {})


# --- Stratum v1 --------------------------------------------------------------------


def test_stratum_subscribe_and_authorize_in_one_write():
    data = stratum("mining.subscribe", ["cpuminer-opt/3.8.8.1"]) + stratum(
        "mining.authorize", [WALLET + ".w1", "x"], 2
    )
    protocol, detail = recognise_payload(data)
    assert protocol == "stratum"
    assert detail == {
        "method": "mining.subscribe",
        "methods": ["mining.subscribe", "mining.authorize"],
        "agent": "cpuminer-opt/3.8.8.1",
        "user": WALLET + ".w1",
    }


def test_ethereum_stratum_subscribe_reports_its_version():
    protocol, detail = recognise_payload(
        stratum("mining.subscribe", ["lolMiner/1.76", "EthereumStratum/1.0.0"])
    )
    assert protocol == "stratum"
    assert detail == {
        "method": "mining.subscribe",
        "agent": "lolMiner/1.76",
        "protocol_version": "EthereumStratum/1.0.0",
    }


def test_stratum_hello_takes_the_agent_from_its_object():
    data = json_line(
        {
            "id": 0,
            "method": "mining.hello",
            "params": {
                "agent": "T-Rex/0.26.8",
                "host": "eu1.example.org",
                "port": "4444",
                "proto": "EthereumStratum/2.0.0",
            },
        }
    )
    assert recognise_payload(data) == (
        "stratum",
        {"method": "mining.hello", "agent": "T-Rex/0.26.8"},
    )


@pytest.mark.parametrize(
    "method", ["mining.submit", "mining.extranonce.subscribe", "mining.configure"]
)
def test_other_stratum_methods(method):
    assert recognise_payload(stratum(method, ["w", "1"])) == ("stratum", {"method": method})


def test_stratum_authorize_cut_inside_its_params_keeps_the_method():
    data = stratum("mining.authorize", [WALLET, "x"])
    cut = data.index(WALLET.encode()) + 10
    assert recognise_payload(data[:cut]) == ("stratum", {"method": "mining.authorize"})


def test_stratum_authorize_cut_after_the_user_keeps_the_user():
    data = stratum("mining.authorize", [WALLET, "password-that-is-cut"])
    cut = data.index(b"password") + 4
    assert recognise_payload(data[:cut]) == (
        "stratum",
        {"method": "mining.authorize", "user": WALLET},
    )


# --- ETHPROXY ----------------------------------------------------------------------


def test_ethproxy_login_gives_wallet_and_worker():
    data = json_line(
        {
            "worker": "rig1",
            "jsonrpc": "2.0",
            "params": ["0x1f9840a85d5af5bf1d1762f925bdaddc4201f984", "x"],
            "id": 1,
            "method": "eth_submitLogin",
        }
    )
    assert recognise_payload(data) == (
        "ethproxy",
        {
            "method": "eth_submitLogin",
            "worker": "rig1",
            "login": "0x1f9840a85d5af5bf1d1762f925bdaddc4201f984",
        },
    )


@pytest.mark.parametrize("method", ["eth_getWork", "eth_submitWork"])
def test_ethproxy_work_messages(method):
    assert recognise_payload(
        json_line({"id": 3, "jsonrpc": "2.0", "method": method, "params": []})
    ) == ("ethproxy", {"method": method})


# --- Stratum V2 ----------------------------------------------------------------------


def test_sv2_setup_connection_is_decoded():
    protocol, detail = recognise_payload(sv2_setup_connection())
    assert protocol == "stratum-v2"
    assert detail == {
        "message": "SetupConnection",
        "subprotocol": "mining",
        "min_version": 2,
        "max_version": 2,
        "flags": 1,
        "endpoint_host": "pool.example.net",
        "endpoint_port": 34254,
        "vendor": "Bitmain",
        "hardware_version": "S19 Pro",
        "firmware": "braiins-os-23.03",
        "device_id": "rig-7",
    }


def test_sv2_frame_cut_short_is_reported_truncated():
    frame = sv2_setup_connection()
    protocol, detail = recognise_payload(frame[:30])
    assert protocol == "stratum-v2"
    assert detail["truncated"] is True
    assert detail["subprotocol"] == "mining"


@pytest.mark.parametrize(
    "frame",
    [
        sv2_setup_connection(protocol=7),
        sv2_setup_connection(min_version=3, max_version=2),
        sv2_setup_connection(min_version=0, max_version=0),
    ],
)
def test_sv2_rejects_implausible_setup_frames(frame):
    assert recognise_payload(frame) == ("unknown", {})


def test_sv2_bytes_after_the_frame_do_not_matter():
    assert recognise_payload(sv2_setup_connection() + b"\x00\x00\x00\x15")[0] == "stratum-v2"


def test_sv2_length_disagreeing_with_its_fields_is_not_sv2():
    frame = bytearray(sv2_setup_connection())
    frame[3] += 1  # declared one byte longer than the fields it carries
    assert recognise_payload(bytes(frame) + b"\x00") == ("unknown", {})


def test_noise_handshake_keys_are_not_claimed_as_sv2():
    # A Noise NX initiator's first message is 64 bytes of ElligatorSwift key:
    # uniformly random by design, so nothing may recognise it.
    rng = random.Random(7)
    for _ in range(2000):
        key = bytes(rng.getrandbits(8) for _ in range(64))
        assert recognise_payload(key)[0] != "stratum-v2"
    assert recognise_payload(b"\x00" * 64) == ("unknown", {})


# --- TLS ----------------------------------------------------------------------------


def test_tls_client_hello_gives_sni_alpn_and_version():
    hello = tls_client_hello("pool.supportxmr.com", ["h2", "http/1.1"])
    protocol, detail = recognise_payload(hello)
    assert protocol == "tls"
    assert detail["sni"] == "pool.supportxmr.com"
    assert detail["alpn"] == ["h2", "http/1.1"]
    assert detail["version"] == ("TLS 1.3" if ssl.HAS_TLSv1_3 else "TLS 1.2")
    assert "truncated" not in detail


def test_tls_client_hello_at_the_capture_limit_keeps_the_early_sni():
    hello = tls_client_hello("xmr-eu1.nanopool.org") + b"\x00" * CAPTURE
    protocol, detail = recognise_payload(hello[:CAPTURE])
    assert protocol == "tls"
    assert detail["sni"] == "xmr-eu1.nanopool.org"


def test_tls_sni_past_the_capture_is_absent_and_marked_truncated():
    hello = tls_client_hello("gulf.moneroocean.stream")
    cut = hello.index(b"gulf.moneroocean.stream") + 4
    protocol, detail = recognise_payload(hello[:cut])
    assert protocol == "tls"
    assert "sni" not in detail
    assert detail["truncated"] is True


def test_tls_without_sni():
    protocol, detail = recognise_payload(tls_client_hello(None))
    assert protocol == "tls"
    assert "sni" not in detail and "truncated" not in detail


def test_tls_handshake_written_to_a_real_socket_pair():
    client, server = socket.socketpair()
    with client, server:
        context = ssl.create_default_context()
        tls = context.wrap_socket(
            client, server_hostname="c3pool.com", do_handshake_on_connect=False
        )
        tls.setblocking(False)
        with pytest.raises(ssl.SSLWantReadError):
            tls.do_handshake()
        first_bytes = server.recv(CAPTURE)
    protocol, detail = recognise_payload(first_bytes)
    assert protocol == "tls"
    assert detail["sni"] == "c3pool.com"


# --- HTTP ----------------------------------------------------------------------------


def test_http_get_gives_path_host_and_agent():
    data = (
        b"GET /api/v1/stats?x=1 HTTP/1.1\r\nHost: api.example.com\r\nUser-Agent: "
        b"python-requests/2.31\r\nAccept: */*\r\n\r\n"
    )
    assert recognise_payload(data) == (
        "http",
        {
            "method": "GET",
            "path": "/api/v1/stats?x=1",
            "version": "HTTP/1.1",
            "host": "api.example.com",
            "user_agent": "python-requests/2.31",
        },
    )


def test_http_connect_reveals_the_destination_behind_the_proxy():
    data = b"CONNECT pool.hashvault.pro:443 HTTP/1.1\r\nHost: pool.hashvault.pro:443\r\n\r\n"
    protocol, detail = recognise_payload(data)
    assert protocol == "http"
    assert detail["method"] == "CONNECT"
    assert detail["target"] == "pool.hashvault.pro:443"
    assert (detail["target_host"], detail["target_port"]) == ("pool.hashvault.pro", 443)


def test_http_connect_to_ipv6_then_tls_inside():
    head = b"CONNECT [2001:db8::7]:3333 HTTP/1.1\r\nHost: [2001:db8::7]:3333\r\n\r\n"
    protocol, detail = recognise_stream([head, tls_client_hello("pool.example.net")])
    assert protocol == "http"
    assert (detail["target_host"], detail["target_port"]) == ("2001:db8::7", 3333)
    assert detail["inner_protocol"] == "tls"
    assert detail["inner_sni"] == "pool.example.net"


def test_http_getwork_post_names_the_rpc_in_its_body():
    body = json.dumps({"jsonrpc": "2.0", "method": "eth_getWork", "params": [], "id": 1}).encode()
    data = (
        b"POST / HTTP/1.1\r\nHost: 127.0.0.1:8545\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    )
    protocol, detail = recognise_payload(data)
    assert protocol == "http"
    assert (detail["body_protocol"], detail["body_method"]) == ("ethproxy", "eth_getWork")


def test_http_headers_cut_short_are_marked_truncated():
    protocol, detail = recognise_payload(b"GET /x HTTP/1.1\r\nHost: a.example\r\nUser-Ag")
    assert protocol == "http"
    assert detail["host"] == "a.example" and detail["truncated"] is True


# --- SOCKS ---------------------------------------------------------------------------


def test_socks5_greeting_alone():
    assert recognise_payload(b"\x05\x02\x00\x02") == (
        "socks5",
        {"stage": "greeting", "methods": ["none", "username"]},
    )


@pytest.mark.parametrize(
    "host, port, kind",
    [
        ("pool.minexmr.com", 4444, "domain"),
        ("203.0.113.9", 3333, "ipv4"),
        ("2001:db8::1:2", 14444, "ipv6"),
    ],
)
def test_socks5_greeting_then_connect_in_separate_writes(host, port, kind):
    protocol, detail = recognise_stream([b"\x05\x01\x00", socks5_connect(host, port)])
    assert protocol == "socks5"
    assert detail == {
        "stage": "connect",
        "methods": ["none"],
        "command": "connect",
        "address_type": kind,
        "target_host": host,
        "target_port": port,
    }


def test_socks5_greeting_and_connect_in_one_buffer():
    protocol, detail = recognise_payload(b"\x05\x01\x00" + socks5_connect("xmr.2miners.com", 2222))
    assert protocol == "socks5"
    assert (detail["stage"], detail["target_host"], detail["target_port"]) == (
        "connect",
        "xmr.2miners.com",
        2222,
    )


def test_socks5_connect_alone_then_tunnelled_xmrig_login():
    protocol, detail = recognise_stream([socks5_connect("198.51.100.20", 10128), xmrig_login()])
    assert protocol == "socks5"
    assert detail["target_host"] == "198.51.100.20"
    assert detail["inner_protocol"] == "cryptonote"
    assert detail["inner_login"] == WALLET
    assert detail["inner_agent"] == XMRIG_AGENT


def test_socks5_username_auth_keeps_the_user_but_not_the_password():
    auth = b"\x01\x05alice\x0ds3cr3t-passw0"
    protocol, detail = recognise_stream(
        [b"\x05\x01\x02", auth, socks5_connect("pool.example.org", 443)]
    )
    assert protocol == "socks5"
    assert detail["username"] == "alice"
    assert detail["target_host"] == "pool.example.org"
    assert all("s3cr3t" not in str(v) for v in detail.values())


def test_socks5_then_tls_inside():
    protocol, detail = recognise_stream(
        [
            b"\x05\x01\x00",
            socks5_connect("pool.example.org", 443),
            tls_client_hello("pool.example.org"),
        ]
    )
    assert detail["inner_protocol"] == "tls"
    assert detail["inner_sni"] == "pool.example.org"


def test_socks4_connect_with_user_id():
    data = b"\x04\x01" + (3333).to_bytes(2, "big") + bytes([192, 0, 2, 44]) + b"miner\x00"
    assert recognise_payload(data) == (
        "socks4",
        {
            "stage": "connect",
            "command": "connect",
            "target_port": 3333,
            "target_host": "192.0.2.44",
            "user_id": "miner",
        },
    )


def test_socks4a_connect_by_name_then_stratum():
    data = (
        b"\x04\x01"
        + (4444).to_bytes(2, "big")
        + b"\x00\x00\x00\x01"
        + b"\x00"
        + b"eth.2miners.com\x00"
    )
    protocol, detail = recognise_stream([data, stratum("mining.subscribe", ["ethminer/0.19.0"])])
    assert protocol == "socks4"
    assert (detail["variant"], detail["target_host"], detail["target_port"]) == (
        "socks4a",
        "eth.2miners.com",
        4444,
    )
    assert (detail["inner_protocol"], detail["inner_agent"]) == ("stratum", "ethminer/0.19.0")


# --- unknown and hostile input ----------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x00",
        b"SSH-2.0-OpenSSH_9.6\r\n",
        b"\x16\x03",
        b"hello world\n",
        b'{"id":1,"method":"getinfo"}\n',
        b"\x05\xff\xff",
        b"\x04\x09\x00\x00",
        b"\x16\x03\x01\x00\x05\x02\x00\x00\x01\x00",
    ],
)
def test_other_bytes_are_unknown(data):
    assert recognise_payload(data) == ("unknown", {})


def samples() -> list[bytes]:
    return [
        xmrig_login(),
        stratum("mining.subscribe", ["cpuminer/2.5"]) + stratum("mining.authorize", ["u", "p"], 2),
        json_line({"worker": "w", "method": "eth_submitLogin", "params": ["0xabc"], "id": 1}),
        sv2_setup_connection(),
        tls_client_hello("pool.example.net", ["h2"]),
        b"CONNECT pool.example.net:443 HTTP/1.1\r\nHost: pool.example.net:443\r\n\r\n"
        + tls_client_hello("p.example"),
        b"GET / HTTP/1.1\r\nHost: a\r\nUser-Agent: b\r\n\r\n",
        b"\x05\x02\x00\x02\x01\x01u\x01p" + socks5_connect("2001:db8::1", 1) + xmrig_login(),
        b"\x04\x01\x00\x50\x00\x00\x00\x09id\x00host.example\x00" + stratum("mining.subscribe", []),
    ]


def test_every_prefix_of_every_sample_gives_a_well_formed_result():
    for sample in samples():
        for end in range(len(sample) + 1):
            assert_well_formed(recognise_payload(sample[:end]))
            assert_well_formed(recognise_stream([sample[: end // 2], sample[end // 2 : end]]))


def test_random_and_mutated_bytes_never_raise():
    rng = random.Random(20240611)
    prefixes = [
        b"",
        b"\x16\x03\x01",
        b"\x16\x03\x03\x02\x00\x01",
        b"\x05",
        b"\x05\x01\x00",
        b"\x04\x01",
        b"\x00\x00\x00",
        b'{"method":"',
        b'{"method":"login","params":{',
        b"GET ",
        b"CONNECT ",
        b"POST / HTTP/1.1\r\n",
    ]
    bases = samples()
    for round_ in range(6000):
        kind = round_ % 3
        if kind == 0:
            data = rng.choice(prefixes) + rng.randbytes(rng.randrange(0, 600))
        elif kind == 1:
            data = bytearray(rng.choice(bases))
            for _ in range(rng.randrange(1, 8)):
                data[rng.randrange(len(data))] = rng.getrandbits(8)
            data = bytes(data[: rng.randrange(len(data) + 1)])
        else:
            data = rng.randbytes(rng.randrange(0, 100))
        assert_well_formed(recognise_payload(data))
        assert_well_formed(recognise_stream([data[:7], data[7:]]))


def test_hostile_json_values_come_out_bounded_and_serialisable():
    data = json_line(
        {
            "id": 1,
            "method": "login",
            "params": {
                "login": "\ud800" + "W" * 5000,
                "agent": {"not": "a string"},
                "algo": ["rx/0", 7, None] + ["x"] * 100,
            },
        }
    )
    protocol, detail = recognise_payload(data)
    assert protocol == "cryptonote"
    assert_well_formed((protocol, detail))
    assert detail["login"].startswith("\\ud800W")
    assert "agent" not in detail
    assert detail["algo"][:1] == ["rx/0"] and len(detail["algo"]) <= payload.MAX_LIST


def test_deeply_nested_json_does_not_raise():
    assert_well_formed(recognise_payload(b"{" + b'"a":[' * 5000 + b"\n"))
    assert_well_formed(recognise_payload(b'{"method":"mining.submit","params":' + b"[" * 8000))


def test_a_decoder_bug_is_contained_and_visible(monkeypatch):
    def broken(data):
        raise RuntimeError("bug")

    monkeypatch.setattr(
        dispatch,
        "DECODERS",
        tuple(replace(d, read=broken) if d.name == "tls" else d for d in dispatch.DECODERS),
    )
    assert recognise_payload(b"\x16\x03\x01\x00\x10\x01") == (
        "unknown",
        {"decode_error": "RuntimeError"},
    )


def test_non_bytes_input_is_unknown():
    assert recognise_payload("GET / HTTP/1.1") == ("unknown", {})  # type: ignore[arg-type]
    assert recognise_stream([None, 3, b"\x05\x01\x00"]) == (
        "socks5",
        {"stage": "greeting", "methods": ["none"]},
    )  # type: ignore[list-item]
    assert recognise_stream(None) == ("unknown", {})  # type: ignore[arg-type]


# --- TLS records after the ClientHello (issue 13) ---------------------------------------


def test_tls_client_writes_after_the_hello_are_tls_records():
    """A ClientHello is often longer than the capture: the sensor then recognises each later write alone."""
    client, server = socket.socketpair()
    with client, server:
        tls = ssl.create_default_context().wrap_socket(
            client, server_hostname="pool.example.org", do_handshake_on_connect=False
        )
        tls.setblocking(False)
        with pytest.raises(ssl.SSLWantReadError):
            tls.do_handshake()
        hello = server.recv(65536)
    assert recognise_payload(hello[:CAPTURE])[0] == "tls"
    later = {
        b"\x14\x03\x03\x00\x01\x01": "change_cipher_spec",
        b"\x17\x03\x03\x00\x35" + bytes(range(0x35)): "application_data",
        b"\x15\x03\x03\x00\x02\x01\x00": "alert",
        b"\x16\x03\x03\x00\x46\x10\x00\x00\x42"
        + bytes(0x42): "handshake",  # ClientKeyExchange (TLS 1.2)
    }
    for data, record in later.items():
        assert recognise_payload(data) == ("tls", {"record": record}), data
    # a ServerHello or a record with an impossible length is still not claimed
    assert recognise_payload(b"\x17\x03\x03\x00\x00")[0] == "unknown"
    assert recognise_payload(b"\x17\x03\x03\xff\xff" + bytes(8))[0] == "unknown"
