"""Cost of the FPU rounding-mode probe (probes/fpu.bpf.c) per context switch, as a ratio.

Usage (as root, from the repository root):

    .venv/bin/python benchmarks/bench_fpu_probe.py [--rounds 100000] [--repeats 7]

Two processes pinned to one CPU pass a byte back and forth (benchmarks/ctxswitch_pingpong.c):
two context switches per round trip, each one a firing of x86_fpu_regs_deactivated.  Runs
alternate between no probe and the probe loaded, in two flavours: the common path (tasks in
round-to-nearest: two kernel reads and a map lookup that misses) and the entry path (tasks in
another rounding mode: an entry updated, rate-limited to one count per ms).  Reports the
median nanoseconds per round trip of each and the ratio to the no-probe runs taken in the
same session (this VM is shared: only the ratio means something).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpuguard.sources.ebpf.fpu_probe import FpuProbe  # noqa: E402


def build() -> Path:
    out = Path(tempfile.gettempdir()) / f"gg-pingpong-{os.getpid()}"
    subprocess.run(
        ["gcc", "-O2", "-o", str(out), str(REPO / "benchmarks" / "ctxswitch_pingpong.c")],
        check=True,
    )
    return out


def round_trip_ns(binary: Path, rounds: int, rounding: bool) -> float:
    result = subprocess.run(
        [str(binary), str(rounds), "1" if rounding else "0"],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(result.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=100000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_fpu_probe: run as root (BPF)", file=sys.stderr)
        return 2
    binary = build()
    runs: dict[tuple[str, bool], list[float]] = {}
    own: dict[bool, list[float]] = {}
    stats_flag = Path("/proc/sys/kernel/bpf_stats_enabled")
    stats_before = stats_flag.read_text().strip()
    try:
        stats_flag.write_text("1")  # the probe's own run time, as the kernel counts it
        for _ in range(args.repeats):
            for rounding in (False, True):
                runs.setdefault(("none", rounding), []).append(
                    round_trip_ns(binary, args.rounds, rounding)
                )
            probe = FpuProbe.open()
            if not probe.loaded:
                print(f"bench_fpu_probe: {probe.blind_spot}", file=sys.stderr)
                return 2
            try:
                for rounding in (False, True):
                    before = probe.run_stats() or (0, 0)
                    runs.setdefault(("probe", rounding), []).append(
                        round_trip_ns(binary, args.rounds, rounding)
                    )
                    after = probe.run_stats() or (0, 0)
                    if after[0] > before[0]:
                        own.setdefault(rounding, []).append(
                            (after[1] - before[1]) / (after[0] - before[0])
                        )
            finally:
                probe.close()
    finally:
        stats_flag.write_text(stats_before)
        binary.unlink(missing_ok=True)
    for rounding, label in ((False, "common path (nearest)"), (True, "entry path (other mode)")):
        base = statistics.median(runs[("none", rounding)])
        loaded = statistics.median(runs[("probe", rounding)])
        per_switch = base / 2
        probe_ns = statistics.median(own[rounding]) if own.get(rounding) else float("nan")
        print(
            f"{label}: a context switch costs ~{per_switch:.0f} ns here (half a round trip, "
            f"no probe); the probe's own run time is {probe_ns:.0f} ns per firing (kernel BPF "
            f"stats): {probe_ns / per_switch:.3f} of a switch.  Round trip with the probe "
            f"{loaded:.0f} ns: wall ratio {loaded / base:.3f} (noise on a shared VM; median of "
            f"{args.repeats})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
