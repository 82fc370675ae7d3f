"""What a process revealed about its network peers, kept current as connects and payloads arrive.

From connects: the ports and addresses it reached.  From recognised payloads
(``events.payload`` details): client agent strings, JSON-RPC/HTTP methods,
login/user values, the hosts it named on the wire (TLS SNI, HTTP Host or
CONNECT, SOCKS target) and the hosts and ports it asked a proxy to reach.
Each new endpoint or kept payload updates the sets in place, so the network
signals read them without re-deriving anything; names are never resolved.
Most processes never connect: each set is one shared empty frozenset until its
first member (eight empty sets per process would cost ~1.7 kB).
"""

from __future__ import annotations

from typing import Any

from gpuguard.correlate.endpoints import parse_endpoint

_TEXT_KEYS = (("agent", "agents"), ("method", "methods"), ("login", "logins"), ("user", "logins"))
MAX_ADDRESSES = 1024  # ports are bounded by their range
MAX_TEXTS = 256  # per set of texts
_EMPTY: frozenset = frozenset()  # shared by every view until a set gets its first member


class NetworkView:
    """Sets of what one process revealed on the network (see the module docstring)."""

    __slots__ = (
        "ports",
        "addresses",
        "agents",
        "methods",
        "logins",
        "payload_hosts",
        "proxy_hosts",
        "proxy_ports",
    )

    def __init__(self) -> None:
        self.ports: set[int] | frozenset[int] = _EMPTY
        self.addresses: set[str] | frozenset[str] = _EMPTY
        self.agents: set[str] | frozenset[str] = _EMPTY
        self.methods: set[str] | frozenset[str] = _EMPTY
        self.logins: set[str] | frozenset[str] = _EMPTY
        self.payload_hosts: set[str] | frozenset[str] = _EMPTY
        self.proxy_hosts: set[str] | frozenset[str] = _EMPTY
        self.proxy_ports: set[int] | frozenset[int] = _EMPTY

    def _writable(self, name: str) -> set:
        """The set ``name``, made a set of its own on the first write."""
        value = getattr(self, name)
        if value is _EMPTY:
            value = set()
            setattr(self, name, value)
        return value

    def add_endpoint(self, address: str, port: int) -> None:
        self._writable("ports").add(port)
        if len(self.addresses) < MAX_ADDRESSES:
            self._writable("addresses").add(address)

    def add_payload_detail(self, detail: dict[str, Any]) -> bool:
        """Take what a recognised payload's detail names (bounded; bad types ignored); True if anything was new."""
        before = self._size()
        for key, into in _TEXT_KEYS:
            value = detail.get(key)
            if isinstance(value, str) and value:
                self._bounded_add(into, value[:256])
        for key in ("sni", "host"):
            value = detail.get(key)
            if isinstance(value, str) and value:
                self._bounded_add("payload_hosts", _host_name(value.split(":")[0]))
        target_host, target_port = detail.get("target_host"), detail.get("target_port")
        if not target_host and detail.get("target"):
            endpoint = parse_endpoint(str(detail["target"]))
            if endpoint:
                target_host, target_port = endpoint.host, endpoint.port
        if isinstance(target_host, str) and target_host:
            host = _host_name(target_host)
            self._bounded_add("proxy_hosts", host)
            self._bounded_add("payload_hosts", host)
        if (
            isinstance(target_port, int)
            and not isinstance(target_port, bool)
            and 0 < target_port < 65536
        ):
            self._writable("proxy_ports").add(target_port)
        return self._size() != before

    def _bounded_add(self, name: str, value: str) -> None:
        if len(getattr(self, name)) < MAX_TEXTS:
            self._writable(name).add(value)

    def _size(self) -> int:
        return (
            len(self.agents)
            + len(self.methods)
            + len(self.logins)
            + len(self.payload_hosts)
            + len(self.proxy_hosts)
            + len(self.proxy_ports)
        )


def _host_name(value: str) -> str:
    return value.lower().rstrip(".")[:253]
