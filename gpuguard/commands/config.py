"""`gpuguard config validate [FILE]`, `reference` and `actions`: check and document agent.yaml.

Like Falco's ``-V``: each problem as ``file:line:col: message`` on stdout (the ``response:``
and ``guard_policies:`` sections included), a count on stderr, exit 2 when there is any and
0 when the file is valid.  A file the agent would refuse (writable by non-root, not a regular
file, too large) is refused here the same way, in one line.

``reference`` prints every key of agent.yaml with its default and doc, generated from the
schema (:data:`gpuguard.agent.config.SCHEMA`); ``--update DOC`` rewrites the generated block
in DOC (docs/agent.md), which a test keeps equal to the schema.  ``actions`` does the same
for the response actions' table and lists (docs/respond.md), from ``ACTIONS``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpuguard.agent.config import DEFAULT_CONFIG_PATH, SCHEMA, config_problems, read_config_file
from gpuguard.commands.options import add_update_option, print_problems, say_updated
from gpuguard.config.reference import reference, update_doc
from gpuguard.errors import GpuguardError
from gpuguard.escape import escape_text
from gpuguard.respond.action_docs import generated, markers

HELP = (
    "check the agent config file (validate), or print every key it takes (reference) "
    "and the response actions (actions)"
)


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
    for name, what, doc in (
        ("reference", "every agent.yaml key with its default and doc, from the schema", "agent"),
        ("actions", "the response actions' table and lists, from ACTIONS", "respond"),
    ):
        add_update_option(sub.add_parser(name, help=what), doc)


def _reference(args: argparse.Namespace) -> int:
    text = reference(SCHEMA)
    if args.update is None:
        print(text, end="")
    else:
        say_updated(args.update, update_doc(args.update, text))
    return 0


def _actions(args: argparse.Namespace) -> int:
    blocks = generated()
    if args.update is None:
        print("\n".join(blocks.values()), end="")
        return 0
    changed = [
        update_doc(args.update, text, markers(name), fence="") for name, text in blocks.items()
    ]
    say_updated(args.update, any(changed))
    return 0


def _validate(args: argparse.Namespace) -> int:
    path: Path = args.file
    if not path.exists() and not path.is_symlink():
        raise GpuguardError(
            f"agent config {path} does not exist", "name an existing file (or create it)"
        )
    _, problems = config_problems(read_config_file(path))
    if print_problems(problems):
        return 2
    print(f"ok: {escape_text(str(path))}")
    return 0


def run(args: argparse.Namespace) -> int:
    command = getattr(args, "config_command", None)
    if command == "reference":
        return _reference(args)
    if command == "actions":
        return _actions(args)
    if command != "validate":
        print(
            "usage: gpuguard config validate [FILE] | reference [--update DOC] "
            "| actions [--update DOC] "
            "(see gpuguard config --help)",
            file=sys.stderr,
        )
        return 2
    return _validate(args)
