"""Sensor overhead: syscall tax, start-up time and steady memory (run as root).

    .venv/bin/python benchmarks/bench_sensor.py [--calls 2000000] [--repeat 5]

Every figure is measured twice in this one run, probes detached and attached,
and reported as a difference and a ratio, so the machine's speed cancels out.
The `strchr`-style mode dispatch inside the C loop is in both measurements.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.workloads import private_dev_command  # noqa: E402

CASES = (
    # (label, mode, path, needs GPU-named nodes)
    ("getppid (no probe on it)", "getppid", None, False),
    ("read 1 B /dev/zero (no probe on it)", "read", None, False),
    ("close(-1) (close probe: 2 map deletes)", "close-bad", None, False),
    ("write 1 B /dev/null (payload probe: 1 lookup)", "write", None, False),
    ("ioctl on untracked fd /dev/null", "ioctl", "/dev/null", False),
    ("ioctl on tracked GPU fd /dev/nvidiactl", "ioctl", "/dev/nvidiactl", True),
)


def build_loop() -> Path:
    out = Path(tempfile.gettempdir()) / "gpuguard-syscall-loop"
    src = Path(__file__).with_name("syscall_loop.c")
    if not out.exists() or out.stat().st_mtime < src.stat().st_mtime:
        subprocess.run(["gcc", "-O2", "-o", str(out), str(src)], check=True)
    return out


def measure(binary: Path, mode: str, path: str | None, gpu: bool, calls: int, repeat: int) -> float:
    argv = [str(binary), mode, str(calls)] + ([path] if path else [])
    results = []
    for _ in range(repeat):
        if gpu:
            cmd, env = private_dev_command(argv)
            out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
        else:
            out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
        results.append(float(out.strip()))
    return statistics.median(results)


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_sensor: needs root (it loads the probes)", file=sys.stderr)
        return 2
    from gpuguard.sources.sensor import Sensor

    binary = build_loop()
    baseline = {label: measure(binary, mode, path, gpu, args.calls, args.repeat) for label, mode, path, gpu in CASES}

    startups = []
    for _ in range(3):
        s = Sensor()
        s.start()
        startups.append(s.stats.startup_seconds)
        s.close()
    rss_before = rss_mb(os.getpid())
    sensor = Sensor()
    sensor.start()
    stop = threading.Event()

    def consume() -> None:
        while not stop.is_set():
            sensor.poll(100)

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    attached = {label: measure(binary, mode, path, gpu, args.calls, args.repeat) for label, mode, path, gpu in CASES}
    time.sleep(1.0)
    rss_steady = rss_mb(os.getpid())
    stop.set()
    consumer.join()
    sensor.close()

    rows = []
    for label, *_ in CASES:
        before, after = baseline[label], attached[label]
        rows.append({"case": label, "ns_detached": before, "ns_attached": after,
                     "delta_ns": round(after - before, 1), "ratio": round(after / before, 2)})
    result = {
        "calls_per_run": args.calls,
        "repeat": args.repeat,
        "syscalls": rows,
        "startup_s": {"median": round(statistics.median(startups), 2), "runs": [round(x, 2) for x in startups]},
        "sensor_rss_mb": {"before_load": round(rss_before, 1), "steady": round(rss_steady, 1)},
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{'case':<48} {'detached':>9} {'attached':>9} {'delta':>8} {'ratio':>6}")
        for r in rows:
            print(f"{r['case']:<48} {r['ns_detached']:>7.1f}ns {r['ns_attached']:>7.1f}ns "
                  f"{r['delta_ns']:>+6.1f}ns {r['ratio']:>6.2f}")
        print(f"probe start-up (compile + attach): median {result['startup_s']['median']} s "
              f"over {result['startup_s']['runs']}")
        print(f"sensor process RSS: {result['sensor_rss_mb']['steady']} MB steady "
              f"(python + bcc before load: {result['sensor_rss_mb']['before_load']} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
