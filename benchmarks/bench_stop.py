"""How fast a stopped sensor lets the process go (run as root).

    .venv/bin/python benchmarks/bench_stop.py [--repeat 5] [--signals 6] [--tree DIR]

Part 1, in one process: ``Sensor.close()`` (probes detached concurrently) against
bcc's own ``BPF.cleanup()`` (one probe after another, the old close), for both
syscall-entry hooks, alternated round by round; medians and their ratio.

Part 2, the CLI: ``gpuguard watch --json`` and ``record`` under a connect +
exec flood get SIGTERM/SIGINT in turn; the time from the signal to the summary
line and to the process's exit.  ``--tree`` runs another checkout's gpuguard
(e.g. the main branch, for the before figures) with this interpreter.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def close_times(repeat: int) -> None:
    from gpuguard.sources.ebpf.probe_source import ProbeSettings
    from gpuguard.sources.ebpf.sensor import Sensor

    for hook in ("tracepoint", "raw"):
        times: dict[str, list[float]] = {
            "sequential (bcc cleanup)": [],
            "concurrent (Sensor.close)": [],
        }
        for _ in range(repeat):
            for label in times:
                sensor = Sensor(ProbeSettings(enter_hook=hook))
                sensor.start()
                probes = len(sensor._bpf.tracepoint_fds) + len(sensor._bpf.raw_tracepoint_fds)
                started = time.perf_counter()
                if label.startswith("sequential"):
                    sensor._bpf.cleanup()
                    sensor._bpf = None
                else:
                    sensor.close()
                times[label].append(time.perf_counter() - started)
        seq, par = (statistics.median(v) for v in times.values())
        print(f"close, enter_hook={hook}, {probes} probes, {repeat} rounds:")
        for label, values in times.items():
            print(
                f"  {label:28} median {statistics.median(values):.3f} s  min {min(values):.3f}  max {max(values):.3f}"
            )
        print(f"  ratio concurrent/sequential: {par / seq:.3f}")


def _flood(stop: threading.Event) -> None:
    while not stop.is_set():
        s = socket.socket()
        try:
            s.connect(("127.0.0.1", 9))
        except OSError:
            pass
        finally:
            s.close()
        subprocess.run(["/bin/true"], check=False)


def cli_times(tree: Path, signals: int) -> None:
    stop = threading.Event()
    floods = [threading.Thread(target=_flood, args=(stop,), daemon=True) for _ in range(2)]
    for t in floods:
        t.start()
    env = {**os.environ, "PYTHONPATH": str(tree)}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for command in ("watch", "record"):
                to_summary, to_exit = [], []
                for attempt in range(signals):
                    sig = (signal.SIGTERM, signal.SIGINT)[attempt % 2]
                    args = (
                        ["watch", "--json", "--all", "--stats"]
                        if command == "watch"
                        else ["record", "--output", f"{tmp}/r{attempt}.ggr", "--gpu-interval", "0"]
                    )
                    proc = subprocess.Popen(
                        [sys.executable, "-m", "gpuguard", *args],
                        cwd=tree,
                        env=env,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE,
                        text=True,
                    )
                    if command == "watch":
                        proc.stdout.readline()  # the flood flows through the callback
                    threading.Thread(target=proc.stdout.read, daemon=True).start()
                    lines: list[tuple[float, str]] = []
                    ready = threading.Event()

                    def read(proc=proc, lines=lines, ready=ready, command=command) -> None:
                        for line in proc.stderr:
                            lines.append((time.monotonic(), line))
                            if "recording to" in line or "watching" in line or command == "watch":
                                ready.set()

                    threading.Thread(target=read, daemon=True).start()
                    ready.wait(30) if command == "record" else None
                    time.sleep(0.5)
                    sent = time.monotonic()
                    proc.send_signal(sig)
                    proc.wait(30)
                    exited = time.monotonic()
                    time.sleep(0.1)
                    summary = [t for t, line in lines if line.startswith("gpuguard: events:")]
                    to_summary.append(summary[0] - sent if summary else float("nan"))
                    to_exit.append(exited - sent)
                print(f"{command} ({tree.name}), {signals} signals under flood:")
                print(
                    f"  signal -> summary: median {statistics.median(to_summary):.2f} s  max {max(to_summary):.2f}"
                )
                print(
                    f"  signal -> exit:    median {statistics.median(to_exit):.2f} s  max {max(to_exit):.2f}"
                    f"  all {' '.join(f'{t:.2f}' for t in to_exit)}"
                )
    finally:
        stop.set()
        for t in floods:
            t.join(10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--signals", type=int, default=6)
    parser.add_argument(
        "--tree", type=Path, default=REPO, help="checkout whose gpuguard the CLI part runs"
    )
    parser.add_argument("--only", choices=("close", "cli"), default=None)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs")
    if args.only != "cli":
        close_times(args.repeat)
    if args.only != "close":
        cli_times(args.tree.resolve(), args.signals)
    return 0


if __name__ == "__main__":
    sys.exit(main())
