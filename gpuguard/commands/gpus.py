"""`gpuguard gpus`: GPU devices and per-process GPU use (placeholder while samplers land)."""

from __future__ import annotations

import argparse

HELP = "show GPUs and the processes using them, for every vendor"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON document")


def run(args: argparse.Namespace) -> int:
    print("no GPU samplers yet")
    return 0
