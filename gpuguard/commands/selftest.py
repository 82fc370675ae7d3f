"""`gpuguard selftest`: start a harmless miner simulator and check that the agent raises the finding.

Uses the running agent (found through its state file) or starts one for the
test; prints PASS or FAIL with the time from the simulator's start to the
finding; exit 0 on PASS, 1 on FAIL (docs/agent.md, "`gpuguard selftest`").
"""

from __future__ import annotations

import argparse

from gpuguard.agent.config import DEFAULT_STATUS_PATH, MODES, SENSORS
from gpuguard.commands.options import add_state_file_option

HELP = "check that the agent catches a harmless miner simulator (PASS/FAIL with the time to detect)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_state_file_option(parser, f"the running agent's state file (default {DEFAULT_STATUS_PATH})")
    parser.add_argument(
        "--mode",
        choices=MODES,
        default=None,
        help="enforce also checks that a response action fired (default: the agent's mode)",
    )
    parser.add_argument(
        "--own-agent",
        action="store_true",
        help="start an agent for the test even when one is running",
    )
    parser.add_argument(
        "--sensor", choices=SENSORS, default="auto", help="sensor of an agent started for the test"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=15.0,
        metavar="S",
        help="how long to wait for the finding (default 15 s)",
    )


def run(args: argparse.Namespace) -> int:
    from gpuguard.proving.selftest import run_selftest

    result = run_selftest(
        args.state_file, args.mode, args.timeout, sensor=args.sensor, own_agent=args.own_agent
    )
    print(f"{'PASS' if result.passed else 'FAIL'}: {result.message}", flush=True)
    return 0 if result.passed else 1
