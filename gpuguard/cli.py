"""Command-line entry point: parses arguments and hands off to one command.

Each command lives in ``gpuguard/commands/<name>.py`` with ``HELP``,
``add_arguments(parser)`` and ``run(args) -> int``.  This module holds no
detection logic; it only turns :class:`GpuguardError` into one line and exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from gpuguard import __version__
from gpuguard.errors import GpuguardError

COMMANDS = (
    "watch",
    "record",
    "replay",
    "gpus",
    "rules",
    "scan",
    "agent",
    "status",
    "selftest",
    "doctor",
    "blocks",
    "unblock",
    "config",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuguard",
        description="Find and stop GPU abuse and cryptominers.",
    )
    parser.add_argument("--version", action="version", version=f"gpuguard {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        module = importlib.import_module(f"gpuguard.commands.{name}")
        cmd = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(cmd)
        cmd.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        parser = build_parser()
        # Option types raise GpuguardError (gpuguard.commands.options): one line, exit 2.
        args = parser.parse_args(argv)
        if not getattr(args, "_run", None):
            parser.print_help(sys.stderr)
            return 2
        return int(args._run(args) or 0)
    except GpuguardError as exc:
        print(f"gpuguard: {exc.one_line()}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `gpuguard watch | head`: the reader went away; not an error.  Python
        # flushes stdout again at exit; point it at /dev/null so that flush
        # cannot fail a second time.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        except (
            OSError,
            ValueError,
        ):  # stdout is not a real file (captured): nothing to flush at exit
            pass
        return 0
