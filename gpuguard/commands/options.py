"""Options, argument types and closing lines the commands share, each written once.

Each number is checked where it is parsed; ``--update DOC`` and a validator's problem list end
with the same lines in every command.

A bad value (``--duration -5``, ``--interval nan``, ``gpus --watch -1``) is a
:class:`GpuguardError` naming the option, so the CLI prints one line and exits 2.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from gpuguard.agent.config import DEFAULT_STATUS_PATH
from gpuguard.errors import GpuguardError
from gpuguard.escape import escape_text

DAY_S = 86_400.0
YEAR_S = 365 * DAY_S


def seconds(
    option: str, *, zero_means: str | None = None, maximum: float = DAY_S
) -> Callable[[str], float]:
    """An argparse ``type`` for a positive, finite number of seconds up to ``maximum``.

    ``zero_means`` allows 0 and says what it does (e.g. "disables sampling").
    """
    lowest = "0" if zero_means else "more than 0"
    fix = f"give a number of seconds, {lowest} and at most {maximum:g}"
    if zero_means:
        fix += f" (0 {zero_means})"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise GpuguardError(f"{option} {text!r} is not a number of seconds", fix) from None
        if (
            not math.isfinite(value)
            or value < 0
            or (value == 0 and not zero_means)
            or value > maximum
        ):
            raise GpuguardError(f"{option} {text} is out of range", fix)
        return value

    parse.__name__ = "seconds"  # argparse names the type in its own messages
    return parse


def add_rules_option(parser: argparse.ArgumentParser, help: str | None = None) -> None:
    """``--rules PATH``, repeatable: rule files layered in order instead of the default set."""
    parser.add_argument(
        "--rules", type=Path, action="append", default=None, metavar="PATH", help=help
    )


def add_state_file_option(parser: argparse.ArgumentParser, help: str) -> None:
    """``--state-file PATH``: the agent's state file a command reads (``help`` names how)."""
    parser.add_argument(
        "--state-file", type=Path, default=DEFAULT_STATUS_PATH, metavar="PATH", help=help
    )


def add_update_option(
    parser: argparse.ArgumentParser, doc: str, what: str = "the generated blocks"
) -> None:
    """``--update DOC``: rewrite ``what`` in DOC (docs/``doc``.md) instead of printing it."""
    parser.add_argument(
        "--update",
        type=Path,
        metavar="DOC",
        help=f"rewrite {what} in DOC (docs/{doc}.md) instead of printing",
    )


def say_updated(path: Path, changed: bool) -> None:
    """The line an ``--update`` ends with: whether ``path`` was rewritten."""
    print(f"{'updated' if changed else 'up to date:'} {escape_text(str(path))}")


def print_problems(problems: Sequence[object]) -> bool:
    """Each problem on its line (escaped), then how many on stderr; whether there were any."""
    for problem in problems:
        print(escape_text(str(problem)))
    if problems:
        print(f"{len(problems)} problem{'s' if len(problems) != 1 else ''}", file=sys.stderr)
    return bool(problems)
