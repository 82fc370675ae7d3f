"""`gpuguard watch`: the live view of GPU opens, ioctls and connections."""

from __future__ import annotations

import argparse
import signal
import sys
import time

from gpuguard.commands.options import YEAR_S, seconds
from gpuguard.outputs.console import LiveView
from gpuguard.outputs.jsonl import dumps_line

HELP = "live view: GPU opens, per-interval ioctl summaries, connections of GPU-touching processes"


def add_sensor_arguments(parser: argparse.ArgumentParser) -> None:
    """Options shared by every command that runs the sensor."""
    parser.add_argument(
        "--interval",
        type=seconds("--interval"),
        default=1.0,
        metavar="S",
        help="seconds between ioctl counter reports (default 1)",
    )
    parser.add_argument(
        "--no-payload",
        action="store_true",
        help="do not capture the first bytes of new connections (removes the write(2) probe)",
    )
    parser.add_argument(
        "--perf-buffer",
        action="store_true",
        help="use a perf buffer even where the kernel has a BPF ring buffer",
    )
    parser.add_argument("--print-probes", action="store_true", help=argparse.SUPPRESS)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", action="store_true", help="one JSON object per event per line (every event)"
    )
    parser.add_argument(
        "--all", action="store_true", help="show every process's events, not only GPU-touching ones"
    )
    parser.add_argument(
        "--duration",
        type=seconds("--duration", maximum=YEAR_S),
        metavar="S",
        help="stop after S seconds",
    )
    parser.add_argument(
        "--stats", action="store_true", help="print sensor statistics on stderr at the end"
    )
    add_sensor_arguments(parser)


def probe_settings(args: argparse.Namespace):
    from gpuguard.sources.ebpf.probe_source import ProbeSettings

    return ProbeSettings(payload_capture=not args.no_payload, perf_buffer=args.perf_buffer)


def printed_probes(args: argparse.Namespace) -> bool:
    """Handle the hidden --print-probes: print the compiled C and say so."""
    if not args.print_probes:
        return False
    from gpuguard.sources.ebpf.probe_source import print_probes

    sys.stdout.write(print_probes(probe_settings(args)))
    return True


def start_sensor(args: argparse.Namespace):
    from gpuguard.sources.ebpf.sensor import Sensor

    sensor = Sensor(probe_settings(args), drain_interval=max(0.05, args.interval))
    sensor.start()
    return sensor


class StopRequest:
    """SIGINT/SIGTERM set a flag the poll loop checks; nothing is raised.

    An exception raised by a signal handler lands wherever Python happens to
    be, including inside bcc's ring-buffer ctypes callback, where ctypes prints
    and swallows it and polling would go on forever.  The handler only records
    the request and asks the sensor to end its current poll between records.
    """

    def __init__(self, sensor) -> None:
        self.sensor = sensor
        self.requested = False
        self._previous = {
            sig: signal.signal(sig, self._handle) for sig in (signal.SIGINT, signal.SIGTERM)
        }

    def _handle(self, signum, frame) -> None:
        self.requested = True
        self.sensor.request_stop()

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def print_stats(sensor) -> None:
    st = sensor.stats
    events = ", ".join(f"{k} {v}" for k, v in sorted(st.events.items())) or "none"
    lost = ", ".join(f"{k} {v}" for k, v in sorted(st.lost.items())) or "none"
    print(
        f"gpuguard: events: {events}; lost: {lost}; malformed: {st.malformed}; "
        f"{f'routing errors (a gpuguard bug): {st.routing_errors}; ' if st.routing_errors else ''}"
        f"start-up {st.startup_seconds:.2f} s ({st.buffer} buffer)",
        file=sys.stderr,
    )


def run(args: argparse.Namespace) -> int:
    if printed_probes(args):
        return 0
    sensor = start_sensor(args)
    stop = StopRequest(sensor)
    view = None if args.json else LiveView(sys.stdout, show_all=args.all)
    # Said in both modes, on stderr (stdout stays the events alone): whoever
    # starts watch in a pipeline learns when the probes are attached.
    print(
        f"gpuguard: watching GPU devices ({sensor.loaded()}); Ctrl-C stops",
        file=sys.stderr,
    )
    deadline = time.monotonic() + args.duration if args.duration else None
    try:
        while not stop.requested and (deadline is None or time.monotonic() < deadline):
            _emit(sensor.poll(100), view)
    finally:
        try:
            sensor.detach_probes()  # the kernel's detach time overlaps the final drain
            _emit(sensor.drain(), view)
        finally:
            stop.restore()
            if args.stats:
                print_stats(sensor)
            sensor.close()
    return 0


def _emit(events, view) -> None:
    if not events:
        return
    if view is None:
        sys.stdout.write("".join(dumps_line(e.to_json()) + "\n" for e in events))
        sys.stdout.flush()
    else:
        view.write(events)
