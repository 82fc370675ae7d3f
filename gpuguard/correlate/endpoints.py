"""Pool endpoints a process reveals in text: URLs and ``host:port`` in its command line or config.

We never resolve names: a domain counts only where the process itself names
it (command line, config file, payload detail).  Parsing is bounded and
regex-only, so hostile command lines cannot make it slow.
"""

from __future__ import annotations

import re
from typing import NamedTuple

MAX_TEXT = 16384
MAX_ENDPOINTS = 32

# scheme://[user[:pass]@]host[:port]
_URL = re.compile(
    r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]{1,30})://(?:[^@\s/'\"]{0,200}@)?"
    r"(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.\-]{1,253})(?::(?P<port>\d{1,5}))?"
)
# host:port without a scheme (xmrig "-o pool.example.com:3333", config "url": "...").
_HOST_PORT = re.compile(
    r"^(?:[^@\s/]{0,200}@)?(?P<host>[A-Za-z0-9_.\-]{1,253}\.[A-Za-z0-9\-]{1,63}|\d{1,3}(?:\.\d{1,3}){3}):(?P<port>\d{1,5})$"
)

# Options whose value is a pool address in common miners (-o/--url xmrig, -P ethminer,
# -pool PhoenixMiner, --pool/--server/-s others).
POOL_OPTIONS = frozenset(
    {"-o", "--url", "-P", "-pool", "--pool", "--server", "-s", "--stratum", "-url"}
)


class Endpoint(NamedTuple):
    scheme: str  # lower-case, "" when none was given
    host: str  # lower-case, no trailing dot
    port: int  # 0 when none was given

    def __str__(self) -> str:
        text = f"{self.scheme}://{self.host}" if self.scheme else self.host
        return f"{text}:{self.port}" if self.port else text


def _endpoint(scheme: str, host: str, port: str | None) -> Endpoint | None:
    port_number = int(port) if port else 0
    if port_number > 65535:
        return None
    return Endpoint(scheme.lower(), host.lower().rstrip(".").strip("[]"), port_number)


def urls_in_text(text: str) -> list[Endpoint]:
    """Every ``scheme://host[:port]`` in ``text`` (first MAX_TEXT characters), in order, unique."""
    found: list[Endpoint] = []
    for match in _URL.finditer(text[:MAX_TEXT]):
        ep = _endpoint(match["scheme"], match["host"], match["port"])
        if ep and ep not in found:
            found.append(ep)
            if len(found) >= MAX_ENDPOINTS:
                break
    return found


def parse_endpoint(value: str) -> Endpoint | None:
    """One endpoint from a URL or a bare ``host:port`` value, else None."""
    value = value.strip()[:512]
    match = _URL.fullmatch(value.rstrip("/"))
    if match:
        return _endpoint(match["scheme"], match["host"], match["port"])
    match = _HOST_PORT.match(value)
    if match:
        return _endpoint("", match["host"], match["port"])
    return None


def endpoints_in_argv(argv: list[str]) -> list[Endpoint]:
    """URLs anywhere in the arguments plus bare ``host:port`` values of pool options."""
    found: list[Endpoint] = []
    previous = ""
    for arg in argv[:256]:
        arg = arg[:1024]
        option, _, inline = arg.partition("=") if arg.startswith("-") else ("", "", "")
        candidates = urls_in_text(arg) if "://" in arg else []
        if previous in POOL_OPTIONS or (inline and option in POOL_OPTIONS):
            ep = parse_endpoint(inline or arg)
            if ep:
                candidates.append(ep)
        for ep in candidates:
            if ep not in found and len(found) < MAX_ENDPOINTS:
                found.append(ep)
        previous = arg
    return found
