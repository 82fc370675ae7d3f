"""Lifting blocks: by id, all of them, or the expired ones, each by its kind's undo."""

from __future__ import annotations

from pathlib import Path

from gpuguard.respond import bpf_pins
from gpuguard.respond.actions import BLOCKS
from gpuguard.respond.blocks import Block, BlockStore
from gpuguard.respond.nft import NftError, NftSets, where


def lift_block(block: Block, store: BlockStore, root: Path) -> str:
    """Undo ``block`` and forget its record; a sentence saying what was done."""
    others = [b for b in store.load() if b.id != block.id]
    kind = BLOCKS.get(block.kind)
    if kind is not None:
        said = kind.lift(block, root, others)
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
                done.append(("nftables", f"removed table inet gpuguard ({where(netns)})"))
        except NftError as exc:
            done.append(("nftables", f"failed: table inet gpuguard ({where(netns)}): {exc}"))
    if not any(said.startswith("failed") for _, said in done):
        done.append(("pins", bpf_pins.remove_block_root(root)))
    return done


def in_place(block: Block, root: Path) -> str:
    """What the kernel (or nftables, or /proc) shows of the block now, for `gpuguard blocks`."""
    kind = BLOCKS.get(block.kind)
    return kind.in_place(block, root) if kind is not None else "?"
