"""Cost of the FPU rounding-mode probe (probes/fpu.bpf.c) per context switch, as a ratio, now and before.

Usage (as root, from the repository root):

    .venv/bin/python benchmarks/bench_fpu_probe.py [--rounds 100000] [--repeats 7] [--before REV]

Two processes pinned to one CPU pass a byte back and forth (benchmarks/ctxswitch_pingpong.c):
two context switches per round trip, each one a firing of x86_fpu_regs_deactivated.  Runs
alternate between no probe, the probe of git revision ``--before`` (default: the one that
counted only samples, non-nearest looks and changes per process, built from that revision's
probes/fpu.bpf.c and gpuguard.h) and today's (per thread: looks per mode, pairs of
consecutive looks, the task state), in two flavours: the common path (tasks in
round-to-nearest: two kernel reads and a map lookup that misses) and the entry path (tasks in
another rounding mode: an entry found, at most one look counted per ms).  Reports the median
nanoseconds per round trip of each, the probe's own run time per firing (kernel BPF
statistics) and the ratios to the no-probe runs taken in the same session (this VM is
shared: only the ratios mean something).  Without git history the "before" runs are skipped.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpuguard.sources.ebpf.btf import Btf  # noqa: E402
from gpuguard.sources.ebpf.fpu_probe import FpuProbe, fpu_offsets  # noqa: E402

BEFORE = "3d0e9c8"  # the last revision whose probe kept per-process samples/nondefault/changes


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


def open_before(revision: str, workdir: Path) -> FpuProbe | None:
    """The probe as revision ``revision`` had it, loaded (None: no such revision here)."""
    for name in ("fpu.bpf.c", "gpuguard.h"):
        shown = subprocess.run(
            ["git", "-C", str(REPO), "show", f"{revision}:probes/{name}"], capture_output=True
        )
        if shown.returncode != 0:
            return None
        (workdir / name).write_bytes(shown.stdout)
    import bcc

    defines = fpu_offsets(Btf.load())
    bpf = bcc.BPF(
        src_file=str(workdir / "fpu.bpf.c").encode(),
        cflags=[f"-I{workdir}", "-Wno-comment"] + [f"-D{k}={v}" for k, v in defines.items()],
    )
    return FpuProbe(bpf, defines=defines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=100000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--before", default=BEFORE, metavar="REV")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_fpu_probe: run as root (BPF)", file=sys.stderr)
        return 2
    binary = build()
    runs: dict[tuple[str, bool], list[float]] = {}
    own: dict[tuple[str, bool], list[float]] = {}
    stats_flag = Path("/proc/sys/kernel/bpf_stats_enabled")
    stats_before = stats_flag.read_text().strip()
    workdir = Path(tempfile.mkdtemp(prefix="gg-fpu-before-"))
    flavours = {"now": FpuProbe.open}
    if open_before(args.before, workdir) is not None:  # compiles: then it is measured too
        flavours = {"before": lambda: open_before(args.before, workdir), **flavours}
    try:
        stats_flag.write_text("1")  # the probe's own run time, as the kernel counts it
        for _ in range(args.repeats):
            for rounding in (False, True):
                runs.setdefault(("none", rounding), []).append(
                    round_trip_ns(binary, args.rounds, rounding)
                )
            for name, open_probe in flavours.items():
                probe = open_probe()
                if not probe.loaded:
                    print(f"bench_fpu_probe: {probe.blind_spot}", file=sys.stderr)
                    return 2
                try:
                    for rounding in (False, True):
                        before = probe.run_stats() or (0, 0)
                        runs.setdefault((name, rounding), []).append(
                            round_trip_ns(binary, args.rounds, rounding)
                        )
                        after = probe.run_stats() or (0, 0)
                        if after[0] > before[0]:
                            own.setdefault((name, rounding), []).append(
                                (after[1] - before[1]) / (after[0] - before[0])
                            )
                finally:
                    probe.close()
    finally:
        stats_flag.write_text(stats_before)
        binary.unlink(missing_ok=True)
        shutil.rmtree(workdir, ignore_errors=True)
    for rounding, label in ((False, "common path (nearest)"), (True, "entry path (other mode)")):
        base = statistics.median(runs[("none", rounding)])
        per_switch = base / 2
        print(
            f"{label}: a context switch costs ~{per_switch:.0f} ns here (half a round trip, no probe)"
        )
        for name in flavours:
            loaded = statistics.median(runs[(name, rounding)])
            found = own.get((name, rounding))
            probe_ns = statistics.median(found) if found else float("nan")
            print(
                f"  probe {name:6s}: {probe_ns:.0f} ns per firing (kernel BPF stats), "
                f"{probe_ns / per_switch:.3f} of a switch; round trip {loaded:.0f} ns, wall "
                f"ratio {loaded / base:.3f} (median of {args.repeats})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
