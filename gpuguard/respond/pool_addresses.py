"""Which addresses block-egress refuses: the pool endpoints a verdict's evidence names.

Only IP addresses are ever blocked (host names are never resolved: a name is
the attacker's to point anywhere), only values that parse as addresses leave
this module, and addresses whose host-wide drop would cut the host off from
itself or its own services stay out of the nftables sets.
"""

from __future__ import annotations

import ipaddress
import re

from gpuguard.correlate.state import ProcessState
from gpuguard.detect.scoring.score import Verdict


def parse_addresses(values: list[str]) -> tuple[list[str], list[str]]:
    """Normalised IP addresses and the values that were not one (never passed on)."""
    good, bad = [], []
    for value in values:
        try:
            good.append(str(ipaddress.ip_address(value)))
        except ValueError:
            bad.append(value)
    return sorted(set(good)), bad


_IP_LITERAL = re.compile(r"(?<![\w.:])(\d{1,3}(?:\.\d{1,3}){3})(?![\w.])|\[([0-9A-Fa-f:.]+)\]")


def pool_endpoints(verdict: Verdict, state: ProcessState) -> list[str]:
    """The pool addresses the evidence names: IP literals in it (a pool URL on the command line, not yet
    connected to) and the connections whose address or port it names; all connections if it names none.
    Host names are never resolved.  Callers validate the result (parse_addresses)."""
    details = " ".join(e.detail for e in verdict.evidence)
    literals = [m.group(1) or m.group(2) for m in _IP_LITERAL.finditer(details)]
    named = [a for (a, p) in state.connections if _named(a, details) or _named(str(p), details)]
    if named or literals:
        return literals + named
    return [a for (a, _p) in state.connections]


def split_host_wide(addresses: list[str], never: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """Addresses fit for the host-wide sets, and those kept to the offender's cgroup.

    Loopback, unspecified, link-local and multicast addresses, and the configured networks, never go
    host-wide: dropping them for the whole host would cut it off from itself or its own services.
    """
    networks = [ipaddress.ip_network(n, strict=False) for n in never]
    host_wide, local = [], []
    for value in addresses:
        ip = ipaddress.ip_address(value)
        keep_local = (
            ip.is_loopback
            or ip.is_unspecified
            or ip.is_link_local
            or ip.is_multicast
            or any(ip.version == n.version and ip in n for n in networks)
        )
        (local if keep_local else host_wide).append(value)
    return host_wide, local


def _named(value: str, text: str) -> bool:
    """``value`` appears in ``text`` as a whole token (port 33 is not named by 3333)."""
    return re.search(rf"(?<![\w.:]){re.escape(value)}(?![\w.:])", text) is not None
