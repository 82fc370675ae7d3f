"""Lifting blocks: by id, all of them, or the expired ones, each by its kind's undo.

Every block kind is declared by the action that leaves it (``ACTIONS``, listed as
``gpuguard.respond.actions.BLOCKS``): its undo, its check for `gpuguard blocks`, and
optionally how it is re-armed and what its blocks shared that goes with the last one.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from gpuguard.respond import bpf_pins
from gpuguard.respond.actions import BLOCKS
from gpuguard.respond.blocks import Block, BlockKind, BlockStore

Kinds = Mapping[str, BlockKind]


def lift_block(block: Block, store: BlockStore, root: Path, kinds: Kinds = BLOCKS) -> str:
    """Undo ``block`` and forget its record; a sentence saying what was done."""
    others = [b for b in store.load() if b.id != block.id]
    kind = kinds.get(block.kind)
    if kind is not None:
        said = kind.lift(block, root, others)
    else:
        said = f"unknown kind {block.kind!r}: record dropped"
    store.remove(block.id)
    return said


def lift_all(
    store: BlockStore, root: Path, netns_seen: set[str] | None = None, kinds: Kinds = BLOCKS
) -> list[tuple[str, str]]:
    """Lift every block, then remove what the response made for them; (what, what was done) pairs.

    After the blocks: what each kind's blocks shared (``table inet gpuguard`` in each namespace
    a block used, or ``netns_seen`` names; never another table), and, when every block was
    lifted, the pins under ``root`` (:func:`bpf_pins.remove_block_root`).
    """
    done = []
    lifted: dict[str, list[Block]] = {}
    for block in store.load():
        lifted.setdefault(block.kind, []).append(block)
        try:
            said = lift_block(block, store, root, kinds)
        except OSError as exc:
            said = f"failed: {exc}"
        done.append((f"{block.id} {block.kind}", said))
    for kind in kinds.values():
        if kind.lift_shared is not None:
            done += kind.lift_shared(lifted.get(kind.name, []), set(netns_seen or ()))
    if not any(said.startswith("failed") for _, said in done):
        done.append(("pins", bpf_pins.remove_block_root(root)))
    return done


def rearm_block(block: Block, store: BlockStore, root: Path, kinds: Kinds = BLOCKS) -> str:
    """Arm again a block that stopped itself (kill-on-touch's circuit breaker); what was done."""
    kind = kinds.get(block.kind)
    if kind is None or kind.rearm is None:
        return f"not re-armed: a {block.kind} block has no circuit breaker"
    return kind.rearm(block, store, root)


def in_place(block: Block, root: Path, kinds: Kinds = BLOCKS) -> str:
    """What the kernel (or nftables, or /proc) shows of the block now, for `gpuguard blocks`."""
    kind = kinds.get(block.kind)
    return kind.in_place(block, root) if kind is not None else "?"
