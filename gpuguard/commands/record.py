"""`gpuguard record`: write sensor events, process facts and GPU samples to a file."""

from __future__ import annotations

import argparse
import sys
import time

from gpuguard.commands.options import YEAR_S, seconds
from gpuguard.commands.watch import (
    StopRequest,
    add_sensor_arguments,
    print_stats,
    printed_probes,
    start_sensor,
)
from gpuguard.events.model import Connect, GpuIoctl, GpuOpen, NetPayload

HELP = "record sensor events, process facts and GPU samples to FILE (msgpack; replay with 'gpuguard replay')"

# Events that make a process worth describing in the recording.
_INTERESTING = (GpuOpen, GpuIoctl, Connect, NetPayload)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--output", "-o", required=True, metavar="FILE", help="recording to write (must not exist)"
    )
    parser.add_argument(
        "--duration",
        type=seconds("--duration", maximum=YEAR_S),
        metavar="S",
        help="stop after S seconds (default: until Ctrl-C)",
    )
    parser.add_argument("--force", action="store_true", help="overwrite FILE if it exists")
    parser.add_argument(
        "--gpu-interval",
        type=seconds("--gpu-interval", zero_means="disables GPU sampling"),
        default=1.0,
        metavar="S",
        help="seconds between GPU telemetry samples (default 1; 0 disables)",
    )
    add_sensor_arguments(parser)


class _Progress:
    """A one-line counter on stderr, redrawn at most once a second, only on a terminal."""

    def __init__(self, path: str, duration: float | None) -> None:
        self.enabled = sys.stderr.isatty()
        self.path = path
        self.duration = duration
        self.started = time.monotonic()
        self.next_draw = 0.0

    def update(self, written: int, lost: int, force: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (now < self.next_draw and not force):
            return
        self.next_draw = now + 1.0
        elapsed = now - self.started
        of = f" / {self.duration:.0f} s" if self.duration else ""
        sys.stderr.write(
            f"\rrecording {self.path}: {written} items, {lost} lost, {elapsed:.0f} s{of}  "
        )
        sys.stderr.flush()

    def done(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


def run(args: argparse.Namespace) -> int:
    from gpuguard.events.wire_write import RecordingWriteFailed, RecordingWriter
    from gpuguard.sources.gpu.registry import open_samplers
    from gpuguard.sources.proc.config_files import collect_facts_with_configs

    if printed_probes(args):
        return 0
    from gpuguard.sources.ebpf.preflight import check_sensor_prerequisites

    check_sensor_prerequisites()  # no root, bcc or headers: say so before anything else
    writer = RecordingWriter(
        args.output,
        meta={"recorder": "gpuguard record", "interval": args.interval},
        overwrite=args.force,
    )
    statuses: list[str] = []
    samplers = open_samplers(on_status=statuses.append) if args.gpu_interval > 0 else []
    for line in statuses:
        print(f"gpuguard: {line}", file=sys.stderr)
    try:
        sensor = start_sensor(args)
    except BaseException:
        writer.close()
        raise
    stop = StopRequest(sensor)
    print(
        f"gpuguard: recording to {args.output} ({sensor.loaded()}); Ctrl-C stops",
        file=sys.stderr,
        flush=True,
    )
    described: set[int] = set()
    progress = _Progress(args.output, args.duration)
    deadline = time.monotonic() + args.duration if args.duration else None
    next_sample = time.monotonic()

    def write_events(events) -> None:
        for event in events:
            if isinstance(event, _INTERESTING) and event.pid not in described:
                described.add(event.pid)
                facts = collect_facts_with_configs(
                    event.pid
                )  # pools hidden in a config file reach replay too
                if facts is not None:
                    writer.write(facts)
            writer.write(event)

    failure: RecordingWriteFailed | None = None
    try:
        while not stop.requested and (deadline is None or time.monotonic() < deadline):
            write_events(sensor.poll(100))
            if samplers and time.monotonic() >= next_sample:
                next_sample = time.monotonic() + args.gpu_interval
                for sampler in samplers:
                    writer.write(sampler.sample())
            writer.flush()  # at most ~10 writes a second; a full disk is found within one poll
            progress.update(writer.items_written, sum(sensor.stats.lost.values()))
    except RecordingWriteFailed as exc:  # disk full: stop, keep what is on disk, say so
        failure = exc
    finally:
        try:
            if failure is None:
                sensor.detach_probes()  # the kernel's detach time overlaps the final drain
                write_events(sensor.drain())
                writer.close()
        except RecordingWriteFailed as exc:
            failure = exc
        finally:
            writer.abandon()  # no-op after close(); after any other exception, closes the file
            stop.restore()
            progress.update(writer.items_written, sum(sensor.stats.lost.values()), force=True)
            progress.done()
            if failure is None:
                print(
                    f"gpuguard: wrote {writer.items_written} items to {args.output}",
                    file=sys.stderr,
                )
            # The summary goes out before close() waits for the probes' detach.
            print_stats(sensor)
            for sampler in samplers:
                sampler.close()
            sensor.close()
    if failure is not None:
        raise failure
    return 0
