"""`gpuguard selftest`: start a harmless miner simulator and check that the agent raises the finding.

Uses the running agent (found through its state file) or starts one for the
test; prints PASS or FAIL with the time from the simulator's start to the
finding (a pass in reduced mode says so); exit 0 on PASS, 1 on FAIL, and with
--require-ebpf on a reduced-mode pass too (docs/agent.md, "`gpuguard selftest`").
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
        "--require-ebpf",
        action="store_true",
        help="fail when the agent runs in reduced mode (no eBPF sensor), even if it caught the simulator",
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
    print(f"{verdict(result, args.require_ebpf)}: {result.message}", flush=True)
    return 0 if result.passed and (result.sensor == "ebpf" or not args.require_ebpf) else 1


def verdict(result, require_ebpf: bool) -> str:
    """PASS only for a full agent; a reduced-mode pass says so (and fails when eBPF is required)."""
    if not result.passed:
        return "FAIL"
    if result.sensor == "ebpf":
        return "PASS"
    reduced = f"reduced mode, sensor {result.sensor or 'unknown'}: kernel events unseen; see gpuguard doctor"
    return f"FAIL (eBPF required; {reduced})" if require_ebpf else f"PASS ({reduced})"
