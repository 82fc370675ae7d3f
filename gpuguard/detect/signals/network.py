"""Rule signals of its network use: connects, recognised payloads, TLS ClientHellos, proxies."""

from __future__ import annotations

from gpuguard.correlate.state import ProcessState
from gpuguard.detect.signals.definition import signal
from gpuguard.detect.signals.parsed import endpoint_hosts, endpoint_ports, named_endpoints


@signal(
    "connect_ports", "numbers", "network", "remote ports it connected to", reads=("network.ports",)
)
def connect_ports(s: ProcessState, now: float) -> set[int]:
    return s.network.ports


@signal(
    "connect_addresses",
    "texts",
    "network",
    "remote addresses it connected to",
    reads=("network.addresses",),
)
def connect_addresses(s: ProcessState, now: float) -> set[str]:
    return s.network.addresses


@signal("connect_count", "number", "network", "connect attempts", reads=("connect_total",))
def connect_count(s: ProcessState, now: float) -> int:
    return s.connect_total


@signal(
    "connected_to_revealed_port",
    "bool",
    "network",
    "it connected to a port named in its own command line or config (the pool it was told to use)",
    reads=("cmdline", "facts.config_files", "network.ports"),
)
def connected_to_revealed_port(s: ProcessState, now: float) -> bool:
    ports = s.network.ports
    if not ports:
        return False
    return bool(ports & endpoint_ports(named_endpoints(s)))


@signal(
    "payload_protocols",
    "texts",
    "network",
    "protocols recognised in its first payload bytes (stratum, cryptonote, ethproxy, socks5, tls...)",
    reads=("payload_protocols",),
)
def payload_protocols(s: ProcessState, now: float) -> set[str]:
    return s.payload_protocols


@signal(
    "payload_agents",
    "texts",
    "network",
    "client agent strings in payloads (cryptonote login agent)",
    reads=("network.agents",),
)
def payload_agents(s: ProcessState, now: float) -> set[str]:
    return s.network.agents


@signal(
    "payload_methods",
    "texts",
    "network",
    "JSON-RPC/HTTP methods in payloads",
    reads=("network.methods",),
)
def payload_methods(s: ProcessState, now: float) -> set[str]:
    return s.network.methods


@signal(
    "payload_logins",
    "texts",
    "network",
    "login/user values in payloads (a wallet, for pool logins)",
    reads=("network.logins",),
)
def payload_logins(s: ProcessState, now: float) -> set[str]:
    return s.network.logins


@signal(
    "payload_hosts",
    "texts",
    "network",
    "host names it revealed on the wire: TLS SNI, HTTP Host/CONNECT, SOCKS target",
    reads=("network.payload_hosts",),
)
def payload_hosts(s: ProcessState, now: float) -> set[str]:
    return s.network.payload_hosts


@signal(
    "tls_ja4",
    "texts",
    "network",
    "JA4 fingerprints of the TLS ClientHellos it sent (docs/event-decoding.md): its TLS library "
    "and settings, e.g. "
    "'t13i310900_e8f1e7e78f70_1f22a2ca17c4': TLS 1.3, no SNI, 31 suites, 9 extensions, no ALPN",
    reads=("payloads",),
)
def tls_ja4(s: ProcessState, now: float) -> set[str]:
    return {
        p.detail["ja4"]
        for p in s.payloads
        if p.protocol == "tls" and isinstance(p.detail.get("ja4"), str)
    }


@signal(
    "proxy_target_hosts",
    "texts",
    "network",
    "hosts it asked a SOCKS/HTTP proxy to reach",
    reads=("network.proxy_hosts",),
)
def proxy_target_hosts(s: ProcessState, now: float) -> set[str]:
    return s.network.proxy_hosts


@signal(
    "proxy_target_ports",
    "numbers",
    "network",
    "ports it asked a SOCKS/HTTP proxy to reach",
    reads=("network.proxy_ports",),
)
def proxy_target_ports(s: ProcessState, now: float) -> set[int]:
    return s.network.proxy_ports


@signal(
    "revealed_hosts",
    "texts",
    "network",
    "every host it named: command line, config files and payloads",
    reads=("cmdline", "facts.config_files", "network.payload_hosts"),
)
def revealed_hosts(s: ProcessState, now: float) -> set[str]:
    return endpoint_hosts(named_endpoints(s)) | s.network.payload_hosts
