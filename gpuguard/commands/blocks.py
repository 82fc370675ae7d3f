"""`gpuguard blocks`: every block the response left in place, with its reason, expiry and kernel state.

Blocks are kill-on-touch entries, quarantine and egress programs on cgroups,
pool addresses in the nftables sets and suspended processes.  They are
recorded in the state directory and pinned under the block root, so they
outlive the agent (see docs/respond.md); `gpuguard unblock` lifts them.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from gpuguard.escape import escape_text
from gpuguard.respond.actions import BLOCK_KINDS
from gpuguard.respond.blocks import BlockStore
from gpuguard.respond.lift import in_place
from gpuguard.respond.settings import DEFAULT_PIN_ROOT, DEFAULT_STATE_DIR

HELP = f"list the blocks in place ({', '.join(BLOCK_KINDS)}) with reason and expiry"


def add_block_location_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--pin-root",
        default=DEFAULT_PIN_ROOT,
        help=f"where the blocks' BPF objects are pinned (response.pin_root; default {DEFAULT_PIN_ROOT})",
    )
    parser.add_argument(
        "--state-dir",
        default=DEFAULT_STATE_DIR,
        help=f"where block records are kept (response.state_dir; default {DEFAULT_STATE_DIR})",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", action="store_true", help="one JSON object per block, one per line"
    )
    add_block_location_arguments(parser)


def _when(epoch: float | None, now: float) -> str:
    if epoch is None:
        return "never"
    left = epoch - now
    return "expired" if left <= 0 else f"in {left:.0f}s"


def run(args: argparse.Namespace) -> int:
    now = time.time()
    root = Path(args.pin_root)
    blocks = BlockStore(args.state_dir).load()
    if args.json:
        for block in blocks:
            print(json.dumps({**block.to_json(), "in_place": in_place(block, root)}))
        return 0
    if not blocks:
        print("no blocks in place")
        return 0
    print(f"{'ID':<12} {'KIND':<14} {'PID':>7} {'EXPIRES':<10} {'STATE':<22} TARGET / REASON")
    for block in blocks:
        target = (
            block.detail.get("cgroup") or ", ".join(block.detail.get("addresses", [])) or block.exe
        )
        print(
            f"{block.id:<12} {block.kind:<14} {block.pid:>7} {_when(block.expires, now):<10} "
            f"{in_place(block, root):<22} {escape_text(block.comm)} {escape_text(target)}: {escape_text(block.reason)}"
        )
    return 0
