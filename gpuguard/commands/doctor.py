"""`gpuguard doctor`: the preflight an operator runs first; exit 0 only when the eBPF sensor loads.

One line per prerequisite (✔ or ✗, what a missing one costs, the fix), or --json; the last
check loads the agent's probes and detaches them (docs/doctor.md).
"""

from __future__ import annotations

import argparse
import json

HELP = (
    "check each prerequisite of the eBPF sensor (✔/✗, the cost, the fix); exit 0 when it will load"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the checks as one JSON document")
    parser.add_argument(
        "--no-load",
        action="store_true",
        help="skip the last check, which loads the agent's probes and detaches them",
    )


def run(args: argparse.Namespace) -> int:
    from gpuguard.escape import escape_text
    from gpuguard.proving.doctor import as_json, ready, run_checks

    checks = run_checks(load=not args.no_load)
    if args.json:
        print(json.dumps(as_json(checks), indent=1))
    else:
        for check in checks:
            print(escape_text(check.line()))
        verdict = (
            "the full eBPF sensor will load"
            if ready(checks)
            else "the eBPF sensor will NOT load fully"
        )
        print(f"gpuguard doctor: {verdict}")
    return 0 if ready(checks) else 1
