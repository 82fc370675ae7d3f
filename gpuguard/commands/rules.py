"""`gpuguard rules`: check rule files, replay golden cases, list rules and signals.

* ``validate [PATH...]`` — every problem as ``file:line:col: message``; exit 0 valid, 2 invalid.
  A valid set warns (``warning: ...``, still exit 0) of each site rule that lets generic facts
  reach ``suspicious`` without a specific one (scoring/cap.py).
* ``test [--cases DIR] [--rules PATH]`` — replay ``DIR/*`` (default ``tests/cases``) through
  decode → correlate → score; pass/fail per case, evidence diff on failure;
  exit 0 all pass, 1 any fail.
* ``list [--maturity TIER]`` — the compiled rules with tiers, weights and the signals they read.
* ``reference [--update DOC]`` — the shipped rules with their tiers, false positives,
  references and runbooks as Markdown (docs/rules-reference.md holds it).
* ``signals [--update DOC]`` — every signal a condition can use, with its type; ``--update``
  rewrites the generated signal table in DOC (docs/rules.md), which a test keeps equal to the
  registry.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpuguard.commands.options import (
    add_rules_option,
    add_update_option,
    print_problems,
    say_updated,
)
from gpuguard.config.reference import update_doc
from gpuguard.detect.ruleset.load import MATURITIES, load_ruleset, validate_rules
from gpuguard.detect.ruleset.operators import OPERATORS
from gpuguard.detect.ruleset.reference import MARKERS as REFERENCE_MARKERS
from gpuguard.detect.ruleset.reference import rules_reference
from gpuguard.detect.ruleset.shipped import default_rule_paths, shipped_rules_file
from gpuguard.detect.scoring.cap import escapes_the_cap
from gpuguard.detect.signals.docs import MARKERS, signal_table
from gpuguard.detect.signals.table import SIGNALS
from gpuguard.escape import escape_text

HELP = "validate rule files, replay golden cases, list rules and signals"
DEFAULT_CASES_DIR = Path("tests/cases")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="rules_command", metavar="ACTION")
    validate = sub.add_parser(
        "validate", help="check rule files; every problem as file:line:col: message"
    )
    validate.add_argument(
        "paths",
        nargs="*",
        type=Path,
        metavar="PATH",
        help="rule files layered in order (default: shipped rules + /etc/gpuguard/*.yaml)",
    )
    validate.add_argument(
        "--with-defaults", action="store_true", help="layer PATHs on top of the default rule files"
    )
    test = sub.add_parser(
        "test", help="replay golden cases and compare verdicts with expected.yaml"
    )
    test.add_argument(
        "--cases",
        type=Path,
        default=DEFAULT_CASES_DIR,
        metavar="DIR",
        help="a directory of cases (each NAME/capture.ggrec + NAME/expected.yaml) or one case "
        f"(default: {DEFAULT_CASES_DIR} under the current directory, as in a checkout)",
    )
    add_rules_option(
        test, "rule files to use instead of the defaults (repeatable, layered in order)"
    )
    test.add_argument(
        "-v", "--verbose", action="store_true", help="print every process's verdict line"
    )
    listing = sub.add_parser("list", help="list the compiled rules")
    add_rules_option(listing)
    listing.add_argument(
        "--maturity",
        choices=MATURITIES,
        default=MATURITIES[-1],
        help="the lowest tier that counts, as the agent's `maturity:` setting (default: all)",
    )
    add_update_option(
        sub.add_parser(
            "reference", help="the shipped rules' tiers, false positives, references, runbooks"
        ),
        "rules-reference",
        "the generated rules reference",
    )
    add_update_option(
        sub.add_parser("signals", help="list the signals conditions can test, and the operators"),
        "rules",
        "the generated signal table",
    )


def _validate(args: argparse.Namespace) -> int:
    paths = list(args.paths) or None
    if args.with_defaults:
        paths = default_rule_paths() + list(args.paths)
    problems = validate_rules(paths)
    files: dict[str, int] = {}  # in the order the layers name them
    for problem in problems:
        files.setdefault(problem.file, len(files))
    problems.sort(key=lambda p: (files[p.file], p.line, p.col))
    if print_problems(problems):
        return 2
    escapes = escapes_the_cap(load_ruleset(paths), load_ruleset([shipped_rules_file()]))
    for rule, why in escapes:
        print(escape_text(f"warning: {rule.source}: rule {rule.id}: {why}"))
    if escapes:
        print(
            f"{len(escapes)} warning{'s' if len(escapes) != 1 else ''}: tag such a rule "
            "`generic` if benign programs show its fact (docs/rules.md, "
            '"A verdict needs a specific fact")',
            file=sys.stderr,
        )
    shown = ", ".join(str(p) for p in (paths or default_rule_paths()))
    print(f"ok: {escape_text(shown)}")
    return 0


def _list(args: argparse.Namespace) -> int:
    ruleset = load_ruleset(args.rules, args.maturity)
    for rule in ruleset.rules + ruleset.disabled:
        state = ""
        if not rule.enabled:
            state = " (disabled)"
        elif not ruleset.counted(rule):
            state = f" (not counted: below {ruleset.counting})"
        print(
            f"{rule.id:36} {rule.maturity:12} {rule.weight:+4d} {rule.severity:8} "
            f"{rule.description}{state}  [{', '.join(rule.signals)}]"
        )
    print(
        f"thresholds: suspicious {ruleset.thresholds.suspicious}, malicious {ruleset.thresholds.malicious}; "
        f"allowlist entries: {len(ruleset.allowlist)}; YARA files: {len(ruleset.yara_files)}"
    )
    return 0


def _signals(args: argparse.Namespace) -> int:
    if args.update is not None:
        say_updated(args.update, update_doc(args.update, signal_table(), MARKERS, fence=""))
        return 0
    for signal in sorted(SIGNALS.values(), key=lambda s: (s.group, s.name)):
        name = f"{signal.name} ({signal.parameter}: ...)" if signal.parameter else signal.name
        print(f"{signal.group:9} {name:28} {signal.type:8} {signal.description}")
    print()
    for name, (types, meaning) in OPERATORS.items():
        print(f"operator {name:15} on {', '.join(types):30} {meaning}")
    return 0


def _reference(args: argparse.Namespace) -> int:
    text = rules_reference(load_ruleset([shipped_rules_file()]))
    if args.update is not None:
        say_updated(args.update, update_doc(args.update, text, REFERENCE_MARKERS, fence=""))
        return 0
    print(text, end="")
    return 0


def _test(args: argparse.Namespace) -> int:
    from gpuguard.detect.cases import run_cases

    ruleset = load_ruleset(args.rules)
    results = run_cases(args.cases, ruleset)
    failed = 0
    for result in results:
        print(f"{'PASS' if result.passed else 'FAIL'} {escape_text(result.name)}")
        if args.verbose or not result.passed:
            for line in result.report_lines(verbose=args.verbose):
                print(f"    {line}")
        failed += not result.passed
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


def run(args: argparse.Namespace) -> int:
    action = getattr(args, "rules_command", None)
    handlers = {
        "validate": _validate,
        "test": _test,
        "list": _list,
        "signals": _signals,
        "reference": _reference,
    }
    if action not in handlers:
        print(
            "usage: gpuguard rules {validate,test,list,signals,reference} (see gpuguard rules --help)",
            file=sys.stderr,
        )
        return 2
    return handlers[action](args)
