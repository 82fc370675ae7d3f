"""Host-wide egress block: pool addresses in nftables sets, dropped on output and forward.

``table inet gpuguard`` holds the sets ``pool4`` (ipv4_addr) and ``pool6``
(ipv6_addr), both with timeouts so elements lift themselves, and two chains
(output, forward) whose one rule each drops traffic to either set.  Every
call sends one JSON batch to ``nft -j -f -`` with a fixed argv (or through
``ip netns exec NAME`` for a named namespace); the batch declares the table,
sets, chains and rules each time (add is idempotent; the chains are flushed
before their rules are added), so it is safe to repeat.  Only addresses that
parse as IP addresses ever reach nft, and they travel as JSON values.
"""

from __future__ import annotations

import ipaddress
import json
import shutil
import subprocess
from typing import Any

TABLE = "gpuguard"
FAMILY = "inet"
SETS = {4: "pool4", 6: "pool6"}
TIMEOUT_S = 10.0


class NftError(Exception):
    pass


class NftSets:
    """The gpuguard nftables table (see the module docstring); ``netns`` names another namespace."""

    def __init__(self, netns: str = "") -> None:
        nft = shutil.which("nft") or "/usr/sbin/nft"
        self.argv = [nft, "-j", "-f", "-"]
        self.list_argv = [nft, "-j", "list", "table", FAMILY, TABLE]
        if netns:
            ip = shutil.which("ip") or "/usr/sbin/ip"
            self.argv = [ip, "netns", "exec", netns, *self.argv]
            self.list_argv = [ip, "netns", "exec", netns, *self.list_argv]

    def _run(self, commands: list[dict[str, Any]]) -> None:
        batch = json.dumps({"nftables": [{"metainfo": {"json_schema_version": 1}}, *commands]})
        done = subprocess.run(
            self.argv, input=batch, capture_output=True, text=True, timeout=TIMEOUT_S, env={}
        )
        if done.returncode != 0:
            raise NftError(
                done.stderr.strip().splitlines()[-1]
                if done.stderr.strip()
                else f"nft exited {done.returncode}"
            )

    def _declare(self) -> list[dict[str, Any]]:
        table = {"family": FAMILY, "table": TABLE}
        out: list[dict[str, Any]] = [{"add": {"table": {"family": FAMILY, "name": TABLE}}}]
        for version, name in SETS.items():
            out.append(
                {
                    "add": {
                        "set": {
                            **table,
                            "name": name,
                            "type": f"ipv{version}_addr",
                            "flags": ["timeout"],
                        }
                    }
                }
            )
        for hook in ("output", "forward"):
            chain = {**table, "name": hook}
            out.append(
                {
                    "add": {
                        "chain": {
                            **chain,
                            "type": "filter",
                            "hook": hook,
                            "prio": 0,
                            "policy": "accept",
                        }
                    }
                }
            )
            out.append({"flush": {"chain": chain}})
            for version, name in SETS.items():
                proto = "ip" if version == 4 else "ip6"
                match = {
                    "match": {
                        "op": "==",
                        "left": {"payload": {"protocol": proto, "field": "daddr"}},
                        "right": f"@{name}",
                    }
                }
                out.append(
                    {
                        "add": {
                            "rule": {
                                **table,
                                "chain": hook,
                                "expr": [match, {"counter": None}, {"drop": None}],
                            }
                        }
                    }
                )
        return out

    def add(self, addresses: list[str], ttl_s: float) -> list[str]:
        """Put ``addresses`` in the sets (refreshing their timeout); returns them normalised."""
        by_set = _by_set(addresses)
        commands = self._declare()
        for name, values in by_set.items():
            elems = [{"elem": {"val": v, "timeout": int(ttl_s)}} if ttl_s else v for v in values]
            commands.append(
                {
                    "add": {
                        "element": {"family": FAMILY, "table": TABLE, "name": name, "elem": elems}
                    }
                }
            )
        self._run(commands)
        return [v for values in by_set.values() for v in values]

    def remove(self, addresses: list[str]) -> None:
        commands = []
        for name, values in _by_set(addresses).items():
            present = set(self.elements().get(name, []))
            gone = [v for v in values if v in present]
            if gone:
                commands.append(
                    {
                        "delete": {
                            "element": {
                                "family": FAMILY,
                                "table": TABLE,
                                "name": name,
                                "elem": gone,
                            }
                        }
                    }
                )
        if commands:
            self._run(commands)

    def elements(self) -> dict[str, list[str]]:
        """The addresses in each set now ({} when the table does not exist)."""
        done = subprocess.run(
            self.list_argv, capture_output=True, text=True, timeout=TIMEOUT_S, env={}
        )
        if done.returncode != 0:
            return {}
        out: dict[str, list[str]] = {}
        for item in json.loads(done.stdout).get("nftables", []):
            found = item.get("set")
            if found and found.get("table") == TABLE:
                out[found["name"]] = [
                    e["elem"]["val"] if isinstance(e, dict) else e for e in found.get("elem", [])
                ]
        return out

    def delete_table(self) -> bool:
        """Delete ``table inet gpuguard`` (only that table) in this namespace; False if absent."""
        if not self._table_exists():
            return False
        self._run([{"delete": {"table": {"family": FAMILY, "name": TABLE}}}])
        return True

    def _table_exists(self) -> bool:
        return (
            subprocess.run(
                self.list_argv, capture_output=True, timeout=TIMEOUT_S, env={}
            ).returncode
            == 0
        )


def _by_set(addresses: list[str]) -> dict[str, list[str]]:
    by_set: dict[str, list[str]] = {}
    for value in addresses:
        ip = ipaddress.ip_address(value)  # ValueError for anything else: never sent to nft
        by_set.setdefault(SETS[ip.version], []).append(str(ip))
    return {k: sorted(set(v)) for k, v in by_set.items()}


def where(netns: str) -> str:
    """The network namespace a table is in, for messages."""
    return f"network namespace {netns}" if netns else "host network namespace"
