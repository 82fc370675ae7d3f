"""`gpuguard unblock ID... | --all | --rearm ID...`: lift blocks, or re-arm suspended ones.

Lifts the blocks the response left in place (see `gpuguard blocks`), or re-arms kill-on-touch
blocks their circuit breaker suspended.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from gpuguard.commands.blocks import add_block_location_arguments
from gpuguard.errors import GpuguardError
from gpuguard.escape import escape_text
from gpuguard.respond.blocks import BlockStore
from gpuguard.respond.lift import lift_all, lift_block, rearm_block

HELP = (
    "lift blocks by id, or all of them (--all then removes table inet gpuguard where a block "
    "used it, and the pins under the block root)"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "ids", nargs="*", metavar="ID", help="block ids as `gpuguard blocks` lists them"
    )
    parser.add_argument("--all", action="store_true", help="lift every block")
    parser.add_argument(
        "--rearm",
        action="store_true",
        help="re-arm the named kill-on-touch blocks their circuit breaker suspended (not lifted)",
    )
    add_block_location_arguments(parser)


def run(args: argparse.Namespace) -> int:
    if bool(args.ids) == bool(args.all) or (args.rearm and args.all):
        raise GpuguardError(
            "name block ids or --all (not both, not neither; --rearm takes ids)",
            "gpuguard blocks lists the ids",
        )
    store = BlockStore(args.state_dir)
    root = Path(args.pin_root)
    if args.all:
        done = lift_all(store, root)
    else:
        done = []
        for block_id in args.ids:
            block = store.get(block_id)
            if block is None:
                raise GpuguardError(
                    f"no block {escape_text(block_id)!s} in {args.state_dir}",
                    "gpuguard blocks lists the ids",
                )
            try:
                said = (
                    rearm_block(block, store, root)
                    if args.rearm
                    else lift_block(block, store, root)
                )
            except OSError as exc:
                said = f"failed: {exc}"
            done.append((f"{block.id} {block.kind}", said))
    failed = 0
    for what, said in done:
        failed += said.startswith("failed")
        print(f"{what}: {escape_text(said)}")
    return 1 if failed else 0
