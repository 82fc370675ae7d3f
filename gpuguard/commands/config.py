"""`gpuguard config validate [FILE]`: every problem in the agent config, without starting the agent.

Like Falco's ``-V``: each problem as ``file:line:col: message`` on stdout (the ``response:``
and ``guard_policies:`` sections included), a count on stderr, exit 2 when there is any and
0 when the file is valid.  A file the agent would refuse (writable by non-root, not a regular
file, too large) is refused here the same way, in one line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpuguard.agent.config import DEFAULT_CONFIG_PATH, config_problems, read_config_file
from gpuguard.errors import GpuguardError
from gpuguard.escape import escape_text

HELP = "check the agent config file; every problem as file:line:col: message"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="config_command", metavar="ACTION")
    validate = sub.add_parser(
        "validate", help="check the agent config; every problem as file:line:col: message"
    )
    validate.add_argument(
        "file",
        nargs="?",
        type=Path,
        default=DEFAULT_CONFIG_PATH,
        metavar="FILE",
        help=f"the agent config (default {DEFAULT_CONFIG_PATH})",
    )


def _validate(args: argparse.Namespace) -> int:
    path: Path = args.file
    if not path.exists() and not path.is_symlink():
        raise GpuguardError(
            f"agent config {path} does not exist", "name an existing file (or create it)"
        )
    _, problems = config_problems(read_config_file(path))
    for problem in problems:
        print(escape_text(problem))
    if problems:
        print(f"{len(problems)} problem{'s' if len(problems) != 1 else ''}", file=sys.stderr)
        return 2
    print(f"ok: {escape_text(str(path))}")
    return 0


def run(args: argparse.Namespace) -> int:
    if getattr(args, "config_command", None) != "validate":
        print(
            "usage: gpuguard config validate [FILE] (see gpuguard config --help)", file=sys.stderr
        )
        return 2
    return _validate(args)
