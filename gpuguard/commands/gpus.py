"""`gpuguard gpus`: GPUs and the processes using them, for NVIDIA, AMD and any DRM driver.

Like nvidia-smi's process table, for every vendor, with each pid attributed to
its process name, user and container (host pids are mapped to the pid the
process has inside its container).  Sources that cannot work here are named
once with the reason; with no GPU at all the command says so and exits 0.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterable

from gpuguard.commands.options import seconds
from gpuguard.events.gpu_snapshot import GpuSnapshot
from gpuguard.events.process_facts import ProcessFacts
from gpuguard.outputs.gpu_table import GpuView, ProcessLabel, render_view, view_to_json
from gpuguard.outputs.jsonl import dumps_line
from gpuguard.sources.gpu.registry import BY_NAME, SOURCE_NAMES, open_samplers
from gpuguard.sources.gpu.sampler import GpuSampler
from gpuguard.sources.proc.process import collect_process_facts

HELP = "show GPUs and the processes using them (NVIDIA, AMD, any DRM driver)"
SETTLE_S = 0.5  # between the two reads a counter source (GpuSource.counters) needs for a rate


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json",
        action="store_true",
        help="print one JSON document (one JSON line per sample with --watch or --replay)",
    )
    parser.add_argument(
        "--watch",
        nargs="?",
        type=seconds("--watch"),
        const=1.0,
        default=None,
        metavar="SECONDS",
        help="refresh every SECONDS (default 1) until Ctrl-C; with --replay, pace by recorded time",
    )
    parser.add_argument("--replay", metavar="FILE", help="show the GPU telemetry recorded in FILE")
    parser.add_argument(
        "--source",
        action="append",
        choices=SOURCE_NAMES,
        dest="sources",
        help="only this source (repeatable; default: all)",
    )
    parser.add_argument("--proc-root", default="/proc", help=argparse.SUPPRESS)


def label_from_facts(facts: ProcessFacts | None) -> ProcessLabel:
    if facts is None:
        return ProcessLabel()  # gone, or a host pid this /proc does not show
    container = ""
    if facts.container_id:
        container = f"{facts.container_runtime or 'container'}:{facts.container_id[:12]}"
    elif facts.pod_uid:
        container = f"pod:{facts.pod_uid}"
    return ProcessLabel(
        name=facts.comm or "?",
        exe=facts.exe,
        user=facts.username or str(facts.uid),
        container=container,
    )


def live_labels(snapshots: Iterable[GpuSnapshot], proc_root: str) -> dict[int, ProcessLabel]:
    pids = {p.pid for snap in snapshots for p in snap.processes}
    return {
        pid: label_from_facts(collect_process_facts(pid, proc_root, with_ancestors=False))
        for pid in pids
    }


def sample_all(samplers: list[GpuSampler]) -> list[GpuSnapshot]:
    return [s.sample() for s in samplers]


def first_view(
    samplers: list[GpuSampler],
    unavailable: list[str],
    proc_root: str,
    sleep: Callable[[float], None] = time.sleep,
) -> GpuView:
    """One reading; sources that report counters get a baseline read first."""
    snapshots = sample_all(samplers)
    if any(s.source in BY_NAME and BY_NAME[s.source].counters for s in samplers):
        sleep(SETTLE_S)
        again = sample_all(samplers)
        for before, after in zip(snapshots, again, strict=False):
            after.errors[:0] = before.errors  # errors are reported once: keep the first read's
        snapshots = again
    return GpuView(time.time(), snapshots, live_labels(snapshots, proc_root), unavailable)


class _Printer:
    """Writes views: JSON lines, or tables (redrawn in place on a terminal when watching)."""

    def __init__(self, as_json: bool, watching: bool) -> None:
        from rich.console import Console

        self.as_json = as_json
        self.console = Console(file=sys.stdout, highlight=False)
        if not self.console.is_terminal:  # piped: no 80-column squeeze, no colour codes
            self.console = Console(file=sys.stdout, highlight=False, width=220, color_system=None)
        self.live = None
        if watching and not as_json and self.console.is_terminal:
            from rich.live import Live

            self.live = Live(console=self.console, auto_refresh=False, screen=False)
            self.live.start()

    def show(self, view: GpuView) -> None:
        if self.as_json:
            sys.stdout.write(dumps_line(view_to_json(view)) + "\n")
            sys.stdout.flush()
        elif self.live is not None:
            self.live.update(render_view(view), refresh=True)
        else:
            self.console.print(render_view(view))

    def stop(self) -> None:
        if self.live is not None:
            self.live.stop()


def run_live(args: argparse.Namespace, printer: _Printer) -> int:
    unavailable: list[str] = []
    samplers = open_samplers(
        args.sources or SOURCE_NAMES, proc_root=args.proc_root, on_status=unavailable.append
    )
    try:
        printer.show(first_view(samplers, unavailable, args.proc_root))
        if args.watch is None:
            return 0
        interval = max(args.watch, 0.1)
        next_due = time.monotonic() + interval
        while True:
            time.sleep(max(0.0, next_due - time.monotonic()))
            next_due += interval
            snapshots = sample_all(samplers)
            printer.show(
                GpuView(time.time(), snapshots, live_labels(snapshots, args.proc_root), unavailable)
            )
    finally:
        for sampler in samplers:
            sampler.close()


def run_replay(args: argparse.Namespace, printer: _Printer) -> int:
    from gpuguard.sources.gpu.replay import ReplaySampler

    sampler = ReplaySampler(args.replay, pace=args.watch is not None)
    try:
        for snapshot in sampler:
            labels = {
                p.pid: label_from_facts(sampler.process_facts.get(p.pid))
                for p in snapshot.processes
            }
            printer.show(GpuView(snapshot.time, [snapshot], labels))
    finally:
        sampler.close()
    return 0


def run(args: argparse.Namespace) -> int:
    printer = _Printer(args.json, watching=args.watch is not None)
    try:
        return run_replay(args, printer) if args.replay else run_live(args, printer)
    except KeyboardInterrupt:
        return 0  # Ctrl-C ends --watch; samplers were closed on the way out
    finally:
        printer.stop()
