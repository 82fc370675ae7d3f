"""The record of every block in place, kept beside its kernel pins so it outlives the agent.

A block is something a response left behind that keeps acting: a
kill-on-touch entry, a quarantine or egress program on a cgroup, pool
addresses in the nftables sets, a suspended process.  Each is one JSON file
in the state directory (root-only), named by its id, listing exactly what to
undo (map keys as hex, the cgroup, the pinned programs, the addresses).
``gpuguard blocks`` lists them; ``gpuguard unblock`` and expiry lift them
(:mod:`gpuguard.respond.lift`).  The kinds are listed by the actions that
leave them (``gpuguard.respond.actions.BLOCK_KINDS``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuguard.errors import GpuguardError


@dataclass(frozen=True, slots=True)
class BlockKind:
    """A kind of block, declared where such blocks are made: its id prefix, its undo, its check."""

    name: str
    prefix: str  # starts its ids
    lift: Callable[[Block, Path, list[Block]], str]  # (block, pin root, the other blocks) -> said
    in_place: Callable[[Block, Path], str]  # what the kernel, nftables or /proc shows of it now
    # `gpuguard unblock --rearm`: (block, store, pin root) -> said; None: it cannot be re-armed
    rearm: Callable[[Block, BlockStore, Path], str] | None = None
    # `gpuguard unblock --all`, after every block: remove what the kind's blocks shared
    # (its blocks lifted, the network namespaces the caller saw used) -> (what, said) lines
    lift_shared: Callable[[list[Block], set[str]], list[tuple[str, str]]] | None = None


@dataclass(slots=True)
class Block:
    id: str
    kind: str
    created: float
    expires: float | None  # epoch seconds; None: until unblocked
    reason: str
    pid: int = 0
    start_time: float = 0.0
    comm: str = ""
    exe: str = ""
    detail: dict[str, Any] = field(default_factory=dict)

    def expired(self, now: float) -> bool:
        return self.expires is not None and now >= self.expires

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def new_block_id(kind: BlockKind) -> str:
    return f"{kind.prefix}-{secrets.token_hex(4)}"


class BlockStore:
    """Block records in ``state_dir`` (see the module docstring)."""

    def __init__(self, state_dir: str) -> None:
        self.dir = Path(state_dir)

    def save(self, block: Block) -> None:
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = self.dir / f".{block.id}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(block.to_json(), f)
        os.replace(tmp, self.dir / f"{block.id}.json")

    def load(self) -> list[Block]:
        blocks = []
        try:
            paths = sorted(self.dir.glob("*.json")) if self.dir.is_dir() else []
            if self.dir.is_dir() and not os.access(self.dir, os.R_OK | os.X_OK):
                raise PermissionError
        except PermissionError:
            raise GpuguardError(
                f"cannot read the block records in {self.dir}: permission denied",
                "run as root (blocks are root's)",
            ) from None
        for path in paths:
            try:
                blocks.append(Block(**json.loads(path.read_text())))
            except (OSError, ValueError, TypeError):
                continue  # a torn or foreign file: not ours to interpret
        return sorted(blocks, key=lambda b: (b.created, b.id))

    def get(self, block_id: str) -> Block | None:
        return next((b for b in self.load() if b.id == block_id), None)

    def remove(self, block_id: str) -> None:
        try:
            (self.dir / f"{block_id}.json").unlink()
        except FileNotFoundError:
            pass
