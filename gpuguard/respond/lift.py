"""Lifting blocks: by id, all of them, or the expired ones; the one place each kind is undone."""

from __future__ import annotations

import signal
from pathlib import Path

from gpuguard.respond import bpf_pins
from gpuguard.respond.blocks import Block, BlockStore
from gpuguard.respond.cgroup_blocks import lift_cgroup_block
from gpuguard.respond.nft import NftError, NftSets
from gpuguard.respond.process_control import RecycledPid, open_process
from gpuguard.respond.touch import lift_touch_block


def lift_block(block: Block, store: BlockStore, root: Path) -> str:
    """Undo ``block`` and forget its record; a sentence saying what was done."""
    others = [b for b in store.load() if b.id != block.id]
    if block.kind == "kill-on-touch":
        said = lift_touch_block(block, root)
    elif block.kind in ("quarantine", "block-egress"):
        said = lift_cgroup_block(block, root, others)
    elif block.kind == "nftables":
        netns = block.detail.get("netns", "")
        same_table = [b for b in others if b.kind == "nftables" and b.detail.get("netns") == netns]
        held = {a for b in same_table for a in b.detail.get("addresses", [])}
        gone = [a for a in block.detail.get("addresses", []) if a not in held]
        nft = NftSets(netns)
        try:
            nft.remove(gone)
            # The last block in this namespace takes the table (its sets, chains, rules) with it.
            dropped = not same_table and nft.delete_table()
        except NftError as exc:
            raise OSError(f"nft refused: {exc}") from None
        said = f"removed {len(gone)} address(es) from table inet gpuguard"
        if dropped:
            said += f", then the table ({_where(netns)})"
    elif block.kind == "suspend":
        try:
            with open_process(block.pid, block.start_time) as handle:
                handle.send(signal.SIGCONT)
            said = f"sent SIGCONT to pid {block.pid}"
        except RecycledPid as exc:
            said = f"nothing to resume: {exc}"
    else:
        said = f"unknown kind {block.kind!r}: record dropped"
    store.remove(block.id)
    return said


def lift_all(
    store: BlockStore, root: Path, netns_seen: set[str] | None = None
) -> list[tuple[str, str]]:
    """Lift every block, then remove what the response made for them; (what, what was done) pairs.

    After the blocks: ``table inet gpuguard`` in each namespace a block used (or ``netns_seen``
    names; never another table), and, when every block was lifted, the pins under ``root``
    (:func:`bpf_pins.remove_block_root`).
    """
    done = []
    namespaces = set(netns_seen or ())
    for block in store.load():
        if block.kind == "nftables":
            namespaces.add(block.detail.get("netns", ""))
        try:
            said = lift_block(block, store, root)
        except OSError as exc:
            said = f"failed: {exc}"
        done.append((f"{block.id} {block.kind}", said))
    for netns in sorted(namespaces):
        try:
            if NftSets(netns).delete_table():
                done.append(("nftables", f"removed table inet gpuguard ({_where(netns)})"))
        except NftError as exc:
            done.append(("nftables", f"failed: table inet gpuguard ({_where(netns)}): {exc}"))
    if not any(said.startswith("failed") for _, said in done):
        done.append(("pins", bpf_pins.remove_block_root(root)))
    return done


def _where(netns: str) -> str:
    return f"network namespace {netns}" if netns else "host network namespace"


def in_place(block: Block, root: Path) -> str:
    """What the kernel (or nftables, or /proc) shows of the block now, for `gpuguard blocks`."""
    if block.kind in ("quarantine", "block-egress"):
        pins = [Path(p["pin"]).exists() for p in block.detail.get("programs", [])]
        return "attached" if pins and all(pins) else "programs missing"
    if block.kind == "kill-on-touch":
        if not (root / "maps" / "touch_paths").exists():
            return "map missing"
        return "suspended (breaker)" if block.detail.get("suspended") else "in kernel map"
    if block.kind == "nftables":
        try:
            present = {
                a
                for values in NftSets(block.detail.get("netns", "")).elements().values()
                for a in values
            }
        except (OSError, ValueError):
            return "nft unavailable"
        wanted = block.detail.get("addresses", [])
        found = sum(a in present for a in wanted)
        return f"{found}/{len(wanted)} addresses in sets"
    if block.kind == "suspend":
        try:
            with open(f"/proc/{block.pid}/stat") as f:
                letter = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            return "process gone"
        return "stopped" if letter in ("T", "t") else "running again"
    return "?"
