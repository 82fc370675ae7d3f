"""`gpuguard scan`: a one-shot, read-only audit of this host (being built; see docs/scan.md)."""

from __future__ import annotations

import argparse

HELP = "audit this host once for miners and GPU abuse (read-only)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON document (ECS field names)")


def run(args: argparse.Namespace) -> int:
    print("gpuguard scan: not available in this build yet")
    return 0
