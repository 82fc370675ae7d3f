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
another rounding mode: an entry found, at most one look counted per ms; and, compiled with
no gap, every firing counted: the cost of one counted look).  Reports the median
nanoseconds per round trip of each, the probe's own run time per firing (kernel BPF
statistics) and the ratios to the no-probe runs taken in the same session (this VM is
shared: only the ratios mean something).  Without git history the "before" runs are skipped.

``--look-rates S`` measures instead how many looks (counted context switches) one thread
spinning through all four rounding modes gets per second over S seconds: alone, in a cgroup
limited to 0.3 of a core, and under a 50 % SIGSTOP/SIGCONT duty cycle (100 ms each, as
cpulimit throttles): what scan's window (docs/scan.md) and the pattern's 64 looks depend on.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
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


def probe_sources(revision: str, workdir: Path) -> Path | None:
    """probes/fpu.bpf.c and gpuguard.h as revision ``revision`` had them, in a directory of
    ``workdir`` (None: no such revision here)."""
    directory = workdir / revision
    directory.mkdir(exist_ok=True)
    for name in ("fpu.bpf.c", "gpuguard.h"):
        shown = subprocess.run(
            ["git", "-C", str(REPO), "show", f"{revision}:probes/{name}"], capture_output=True
        )
        if shown.returncode != 0:
            return None
        (directory / name).write_bytes(shown.stdout)
    return directory


def load_probe(directory: Path, every_look: bool) -> FpuProbe:
    """The probe compiled from ``directory``; ``every_look``: no 1 ms gap between counted
    looks, so every firing of a task in another mode takes the counting path."""
    import bcc

    defines = fpu_offsets(Btf.load()) | ({"GG_FPU_MIN_GAP_NS": 0} if every_look else {})
    bpf = bcc.BPF(
        src_file=str(directory / "fpu.bpf.c").encode(),
        cflags=[f"-I{directory}", "-Wno-comment"] + [f"-D{k}={v}" for k, v in defines.items()],
    )
    return FpuProbe(bpf, defines=defines)


SPINNER = REPO / "tests" / "workloads" / "rounding_spinner.c"


def look_rates(seconds: float) -> int:
    """Looks per second of a lone RandomX-like thread alone, at 0.3 core, and stop-cycled."""
    workdir = Path(tempfile.mkdtemp(prefix="gg-look-rates-"))
    subprocess.run(["gcc", "-O2", "-o", str(workdir / "spin"), str(SPINNER)], check=True)
    quota = Path(f"/sys/fs/cgroup/cpu/gg-bench-quota-{os.getpid()}")
    probe = FpuProbe.open()
    if not probe.loaded:
        print(f"bench_fpu_probe: {probe.blind_spot}", file=sys.stderr)
        return 2
    try:
        quota.mkdir()
        (quota / "cpu.cfs_period_us").write_text("100000")
        (quota / "cpu.cfs_quota_us").write_text("30000")
        for label in ("alone", "in a 0.3-core cgroup", "stopped 100 ms of every 200 ms"):
            spinner = subprocess.Popen([str(workdir / "spin")], stdout=subprocess.DEVNULL)
            try:
                if "cgroup" in label:
                    (quota / "cgroup.procs").write_text(str(spinner.pid))
                time.sleep(1.0)
                first = probe.counts().get(spinner.pid)
                started = time.monotonic()
                while time.monotonic() - started < seconds:
                    if "stopped" in label:
                        time.sleep(0.1)
                        spinner.send_signal(signal.SIGSTOP)
                        time.sleep(0.1)
                        spinner.send_signal(signal.SIGCONT)
                    else:
                        time.sleep(0.2)
                last = probe.counts().get(spinner.pid)
                elapsed = time.monotonic() - started
            finally:
                spinner.kill()
                spinner.wait()
            looks = (last.samples if last else 0) - (first.samples if first else 0)
            print(
                f"{label}: {looks / elapsed:.1f} looks/s over {elapsed:.0f} s "
                f"(64 looks in {64 * elapsed / max(looks, 1):.1f} s); load {os.getloadavg()[0]:.1f}"
            )
    finally:
        probe.close()
        try:
            quota.rmdir()
        except OSError:
            pass
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=100000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--before", default=BEFORE, metavar="REV")
    parser.add_argument("--look-rates", type=float, default=0.0, metavar="SECONDS")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_fpu_probe: run as root (BPF)", file=sys.stderr)
        return 2
    if args.look_rates:
        return look_rates(args.look_rates)
    binary = build()
    runs: dict[tuple[str, bool], list[float]] = {}
    own: dict[tuple[str, bool], list[float]] = {}
    stats_flag = Path("/proc/sys/kernel/bpf_stats_enabled")
    stats_before = stats_flag.read_text().strip()
    workdir = Path(tempfile.mkdtemp(prefix="gg-fpu-before-"))
    now = REPO / "probes"
    before_dir = probe_sources(args.before, workdir)
    flavours = {
        "now": lambda: load_probe(now, False),
        "now, every look": lambda: load_probe(now, True),
    }
    if before_dir is not None:  # the revision is here: measured too
        flavours = {
            "before": lambda: load_probe(before_dir, False),
            "before, every look": lambda: load_probe(before_dir, True),
            **flavours,
        }
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
                f"  probe {name:18s}: {probe_ns:.0f} ns per firing (kernel BPF stats), "
                f"{probe_ns / per_switch:.3f} of a switch; round trip {loaded:.0f} ns, wall "
                f"ratio {loaded / base:.3f} (median of {args.repeats})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
