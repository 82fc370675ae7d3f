"""`gpuguard replay`: read a recording back, as the live view or as JSON lines."""

from __future__ import annotations

import argparse
import sys

from gpuguard.events.model import Event
from gpuguard.outputs.console import LiveView
from gpuguard.outputs.jsonl import dumps_line

HELP = "read a recording back: the live view's lines, or every item as JSON lines (--json)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE", help="a recording made by 'gpuguard record'")
    parser.add_argument(
        "--json",
        action="store_true",
        help="every item as one JSON object per line (events, process facts, GPU snapshots)",
    )
    parser.add_argument(
        "--all", action="store_true", help="show every process's events, not only GPU-touching ones"
    )


def _json_of(item) -> dict:
    from gpuguard.events.wire_format import item_record

    return item.to_json() if isinstance(item, Event) else item_record(item)


def run(args: argparse.Namespace) -> int:
    from gpuguard.events.wire import iter_recording

    view = None if args.json else LiveView(sys.stdout, show_all=args.all)
    batch: list[Event] = []
    try:
        for item in iter_recording(args.file):
            if view is None:
                sys.stdout.write(dumps_line(_json_of(item)) + "\n")
            elif isinstance(item, Event):
                batch.append(item)
                if item.kind == "gpu_ioctl" or len(batch) >= 256:
                    view.write(batch)
                    batch = []
    finally:
        # Whatever was read before any damage is shown before the error line.
        if view is not None and batch:
            view.write(batch)
        sys.stdout.flush()
    return 0
