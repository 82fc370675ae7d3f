"""Sensor overhead: syscall tax, start-up time and steady memory (run as root).

    .venv/bin/python benchmarks/bench_sensor.py [--calls 2000000] [--repeat 5]
        [--variant tracepoint,raw,tracepoint-nohuge] [--floors] [--json] [--record-pair | --mmap-pair]

Every program variant is compiled and loaded once, then attached only while
its own measurements run.  Each round runs every case detached and then with
each variant attached, back to back, so the machine's drift (other jobs on the
same cores) hits both sides of a pair alike; the reported delta is the median
of those paired differences, the detached/attached columns are medians too.

Variants: ``tracepoint`` (the default sensor), ``raw`` (enter_hook="raw":
every sys_enter hook in one raw sys_enter program), ``tracepoint-nohuge`` (the
default sensor with its mmap/shmget huge-page tracepoints left detached: the
per-round difference to ``tracepoint`` on the mmap case is those probes' cost).  ``--floors`` adds two
empty programs that show what the kernel charges before a probe does any
work: an empty syscalls:sys_enter_ioctl program, and an empty raw sys_enter.
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
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.workloads import private_dev_command  # noqa: E402

CASES = (
    # (label, mode, path, needs GPU-named nodes)
    ("getppid (no probe on it)", "getppid", None, False),
    ("read 1 B /dev/zero (no probe on it)", "read", None, False),
    ("close(-1) (close probe)", "close-bad", None, False),
    ("write 1 B /dev/null (payload probe)", "write", None, False),
    ("ioctl on untracked fd /dev/null", "ioctl", "/dev/null", False),
    ("ioctl on tracked GPU fd /dev/nvidiactl", "ioctl", "/dev/nvidiactl", True),
    # The per-connection activity record: a GPU holder's connection vs anyone's (issue 13).
    ("write 1 B, UDP (captured 4, then slot)", "send", "PORT", True),
    ("write 1 B, UDP of a GPU holder (record)", "send-gpu", "PORT", True),
    # The same two probe paths on a write the kernel fails with EFAULT (NULL buffer): the
    # probes run in full, the syscall behind them is cheap, so the difference is resolvable.
    ("write EFAULT, UDP (captured 4, then slot)", "send-fault", "PORT", True),
    ("write EFAULT, UDP of a GPU holder (record)", "send-gpu-fault", "PORT", True),
    # The huge-page probe (sys_enter_mmap): an ordinary mmap pays the tracepoint and one flag test.
    ("mmap+munmap 4 KiB anon (huge-page probe)", "mmap", None, False),
    ("mmap EINVAL (huge-page probe, cheap call)", "mmap-einval", None, False),
)

# The sensor's syscall tracepoints the "tracepoint-nohuge" variant leaves detached: the same
# loaded program without its huge-page probes, so the difference is those probes' own cost.
HUGE_PAGE_TPS = (b"syscalls:sys_enter_mmap", b"syscalls:sys_enter_shmget")
VARIANTS = ("tracepoint", "raw", "tracepoint-nohuge")

# (non-holder case, GPU-holder case): their per-round difference is the record's cost.
RECORD_PAIRS = (
    ("write 1 B, UDP (captured 4, then slot)", "write 1 B, UDP of a GPU holder (record)"),
    ("write EFAULT, UDP (captured 4, then slot)", "write EFAULT, UDP of a GPU holder (record)"),
)

FLOORS = {
    "floor-tp-ioctl": b"TRACEPOINT_PROBE(syscalls, sys_enter_ioctl) { return 0; }",
    "floor-raw": b"RAW_TRACEPOINT_PROBE(sys_enter) { return 0; }",
}


def build_loop() -> Path:
    out = Path(tempfile.gettempdir()) / "gpuguard-syscall-loop"
    src = Path(__file__).with_name("syscall_loop.c")
    if not out.exists() or out.stat().st_mtime < src.stat().st_mtime:
        subprocess.run(["gcc", "-O2", "-o", str(out), str(src)], check=True)
    return out


SINK_PORT = [0]


def start_sink() -> int:
    """A bound loopback UDP port nobody reads (the send cases): datagrams beyond its buffer are dropped."""
    import socket

    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind(("127.0.0.1", 0))
    start_sink.keep = sink  # type: ignore[attr-defined]
    return sink.getsockname()[1]


def run_once(binary: Path, mode: str, path: str | None, gpu: bool, calls: int) -> float:
    if path == "PORT":
        path = str(SINK_PORT[0])
    argv = [str(binary), mode, str(calls)] + ([path] if path else [])
    if gpu:
        cmd, env = private_dev_command(argv)
        out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    else:
        out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    return float(out.strip())


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def foreign_bpf_holders() -> list[int]:
    """Other processes holding BPF programs: their probes skew both columns."""
    me, pids = os.getpid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
            if any(os.readlink(f"/proc/{entry}/fd/{fd}") == "anon_inode:bpf-prog" for fd in fds):
                pids.append(int(entry))
        except OSError:
            continue
    return pids


class Attachable:
    """A loaded bcc program whose tracepoints can be detached and re-attached."""

    def __init__(self, bpf, leave_out: tuple[bytes, ...] = ()) -> None:
        self.bpf = bpf
        self.tps = [tp for tp in bpf.tracepoint_fds if tp not in leave_out]
        self.raws = list(bpf.raw_tracepoint_fds)
        self.detach()

    def detach(self) -> None:
        for tp in list(self.bpf.tracepoint_fds):
            self.bpf.detach_tracepoint(tp)
        for tp in list(self.bpf.raw_tracepoint_fds):
            self.bpf.detach_raw_tracepoint(tp)

    def attach(self) -> None:
        for tp in self.tps:
            self.bpf.attach_tracepoint(tp=tp, fn_name=b"tracepoint__" + tp.replace(b":", b"__"))
        for tp in self.raws:
            self.bpf.attach_raw_tracepoint(tp=tp, fn_name=b"raw_tracepoint__" + tp)


@contextmanager
def polled_sensor():
    """The default sensor, loaded, with a thread draining its events (probes detached by Attachable)."""
    from gpuguard.sources.ebpf.probe_source import ProbeSettings
    from gpuguard.sources.ebpf.sensor import Sensor

    sensor = Sensor(ProbeSettings())
    sensor.start()
    stop = threading.Event()

    def consume() -> None:
        while not stop.is_set():
            sensor.poll(20)

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    try:
        yield sensor
    finally:
        stop.set()
        consumer.join()
        sensor.close()


def timed_pairs(
    argv: list[str], prog: Attachable | None, private_dev: bool
) -> tuple[float, float, float]:
    """One syscall_loop *-pair run (side 1 ns, side 0 ns, median difference), with ``prog`` attached."""
    if prog is not None:
        prog.attach()
    try:
        if private_dev:
            cmd, env = private_dev_command(argv)
            out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
        else:
            out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    finally:
        if prog is not None:
            prog.detach()
    one, zero, diff = (float(x) for x in out.split())
    return one, zero, diff


def pair_medians(rows: dict[str, dict[str, list[float]]]) -> dict[str, dict]:
    med = statistics.median
    return {
        key: {k: round(med(v), 1) for k, v in row.items()}
        | {"diff_rounds": [round(d, 1) for d in row["diff"]]}
        for key, row in rows.items()
    }


def record_pair(binary: Path, args) -> int:
    """The activity record's cost per send, measured where run-to-run noise cannot hide it.

    One process holds two connected UDP sockets, one with an activity record (connected
    after it opened /dev/nvidiactl) and one without; syscall_loop alternates timed blocks
    of writes between them.  Detached, the two are the same syscall, so their difference
    is the method's own floor; attached, it is the record's cost on top of the path every
    socket write already pays (the slot read).
    """
    rows: dict[str, dict[str, list[float]]] = {}
    with polled_sensor() as sensor:
        prog = Attachable(sensor._bpf)
        for _ in range(args.repeat):
            for mode in ("send", "fault"):
                for state, attached in (("detached", None), ("attached", prog)):
                    argv = [str(binary), "send-pair", str(args.calls), str(SINK_PORT[0])]
                    argv += ["fault"] if mode == "fault" else []
                    figures = timed_pairs(argv, attached, private_dev=True)
                    row = rows.setdefault(
                        f"{mode} {state}", {"record": [], "plain": [], "diff": []}
                    )
                    for key, value in zip(("record", "plain", "diff"), figures, strict=False):
                        row[key].append(value)
    result = pair_medians(rows)
    if args.json:
        print(
            json.dumps(
                {"calls_per_run": args.calls, "rounds": args.repeat, "record_pair": result},
                indent=2,
            )
        )
        return 0
    print(
        f"activity record per write, one process, interleaved blocks ({args.calls} calls x {args.repeat} rounds)"
    )
    print(f"{'write':<22} {'with record':>12} {'without':>10} {'difference':>11}  per round")
    for key, r in result.items():
        print(
            f"{key:<22} {r['record']:>10.1f}ns {r['plain']:>8.1f}ns {r['diff']:>+9.1f}ns  {r['diff_rounds']}"
        )
    return 0


def mmap_pair(binary: Path, args) -> int:
    """The huge-page probe's cost on an ordinary mmap, measured in one process (like --record-pair).

    syscall_loop alternates timed blocks of mmap(len 0) and munmap(len 0): both fail with
    EINVAL at once, only mmap has a probe.  Each round runs it detached, with the sensor,
    and with the same sensor minus its huge-page tracepoints; the sensor's difference minus
    the one without those tracepoints is their cost per mmap.
    """
    with polled_sensor() as sensor:
        states = {
            "detached": None,
            "sensor": Attachable(sensor._bpf),
            "sensor without huge-page probes": Attachable(sensor._bpf, HUGE_PAGE_TPS),
        }
        rows: dict[str, dict[str, list[float]]] = {
            name: {"mmap": [], "munmap": [], "diff": []} for name in states
        }
        for _ in range(args.repeat):
            for name, prog in states.items():
                figures = timed_pairs(
                    [str(binary), "mmap-pair", str(args.calls)], prog, private_dev=False
                )
                for key, value in zip(("mmap", "munmap", "diff"), figures, strict=False):
                    rows[name][key].append(value)
    med = statistics.median
    result = pair_medians(rows)
    with_probe, without = rows["sensor"]["diff"], rows["sensor without huge-page probes"]["diff"]
    cost = med([a - b for a, b in zip(with_probe, without, strict=False)])
    base = result["sensor without huge-page probes"]["mmap"]
    summary = {
        "probe_ns_per_mmap": round(cost, 1),
        "rounds_ns": [round(a - b, 1) for a, b in zip(with_probe, without, strict=False)],
        "ratio_mmap_einval": round((base + cost) / base, 3),
        "ratio_to_no_sensor": round(result["sensor"]["mmap"] / result["detached"]["mmap"], 3),
    }
    if args.json:
        print(
            json.dumps(
                {
                    "calls_per_run": args.calls,
                    "rounds": args.repeat,
                    "mmap_pair": result,
                    "huge_probe": summary,
                },
                indent=2,
            )
        )
        return 0
    print(
        f"huge-page probe per ordinary mmap, one process, interleaved blocks ({args.calls} calls "
        f"x {args.repeat} rounds)"
    )
    print(f"{'state':<34} {'mmap':>9} {'munmap':>9} {'difference':>11}  per round")
    for name, r in result.items():
        print(
            f"{name:<34} {r['mmap']:>7.1f}ns {r['munmap']:>7.1f}ns {r['diff']:>+9.1f}ns  {r['diff_rounds']}"
        )
    print(
        f"probe cost: {summary['probe_ns_per_mmap']:+.1f} ns per mmap (per round {summary['rounds_ns']}); "
        f"ratio on mmap(EINVAL) {summary['ratio_mmap_einval']} to the sensor without it, "
        f"{summary['ratio_to_no_sensor']} to no sensor"
    )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2_000_000)
    parser.add_argument(
        "--repeat", type=int, default=5, help="rounds (each: detached + every variant)"
    )
    parser.add_argument(
        "--variant",
        default="tracepoint,raw,tracepoint-nohuge",
        help="comma-separated: " + ", ".join(VARIANTS),
    )
    parser.add_argument(
        "--floors", action="store_true", help="also measure empty reference programs"
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--only", default="", metavar="TEXT", help="only the cases whose label contains TEXT"
    )
    parser.add_argument(
        "--record-pair",
        action="store_true",
        help="measure only the activity record's cost per send, in one process "
        "(send-pair: a socket with a record vs one without, interleaved blocks)",
    )
    parser.add_argument(
        "--mmap-pair",
        action="store_true",
        help="measure only the huge-page probe's cost per ordinary mmap, in one process "
        "(mmap-pair: mmap(len 0) vs munmap(len 0), interleaved blocks)",
    )
    args = parser.parse_args()
    cases = [c for c in CASES if args.only in c[0]]
    if os.geteuid() != 0:
        print("bench_sensor: needs root (it loads the probes)", file=sys.stderr)
        return 2
    import bcc

    from gpuguard.sources.ebpf.probe_source import ProbeSettings
    from gpuguard.sources.ebpf.sensor import Sensor

    binary = build_loop()
    SINK_PORT[0] = start_sink()
    if args.record_pair:
        return record_pair(binary, args)
    if args.mmap_pair:
        return mmap_pair(binary, args)
    variants = [v for v in args.variant.split(",") if v]
    for v in variants:
        if v not in VARIANTS:
            parser.error(f"unknown variant {v!r}")

    # Start-up (compile + load + attach) of each variant, three times.
    startups: dict[str, list[float]] = {}
    for v in variants:
        if v == "tracepoint-nohuge":
            continue  # the tracepoint program, attached in part
        startups[v] = []
        for _ in range(3):
            s = Sensor(ProbeSettings(enter_hook=v))
            s.start()
            startups[v].append(s.stats.startup_seconds)
            s.close()

    rss_before = rss_mb(os.getpid())
    sensors: dict[str, Sensor] = {}
    programs: dict[str, Attachable] = {}
    rss_one = 0.0
    for v in variants:
        hook = "tracepoint" if v == "tracepoint-nohuge" else v
        sensors[v] = Sensor(ProbeSettings(enter_hook=hook))
        sensors[v].start()
        programs[v] = Attachable(sensors[v]._bpf, HUGE_PAGE_TPS if v == "tracepoint-nohuge" else ())
        if not rss_one:
            rss_one = rss_mb(os.getpid())
    if args.floors:
        for name, text in FLOORS.items():
            programs[name] = Attachable(bcc.BPF(text=b"#include <uapi/linux/ptrace.h>\n" + text))

    stop = threading.Event()

    def consume() -> None:
        while not stop.is_set():
            for s in sensors.values():
                s.poll(20)

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    foreign = foreign_bpf_holders()

    detached: dict[str, list[float]] = {c[0]: [] for c in cases}
    attached: dict[str, dict[str, list[float]]] = {p: {c[0]: [] for c in cases} for p in programs}
    deltas: dict[str, dict[str, list[float]]] = {p: {c[0]: [] for c in cases} for p in programs}
    for _ in range(args.repeat):
        for label, mode, path, gpu in cases:
            base = run_once(binary, mode, path, gpu, args.calls)
            detached[label].append(base)
            for name, prog in programs.items():
                prog.attach()
                try:
                    t = run_once(binary, mode, path, gpu, args.calls)
                finally:
                    prog.detach()
                attached[name][label].append(t)
                deltas[name][label].append(t - base)
    time.sleep(1.0)
    rss_steady = rss_mb(os.getpid())
    stop.set()
    consumer.join()
    for s in sensors.values():
        s.close()

    med = statistics.median
    result = {
        "calls_per_run": args.calls,
        "rounds": args.repeat,
        "foreign_bpf_pids": foreign,
        "variants": {},
        "startup_s": {
            v: {"median": round(med(x), 2), "runs": [round(y, 2) for y in x]}
            for v, x in startups.items()
        },
        "sensor_rss_mb": {
            "before_load": round(rss_before, 1),
            "one_sensor_loaded": round(rss_one, 1),
            "steady_all_loaded": round(rss_steady, 1),
        },
    }
    for name in programs:
        rows = []
        for label, *_ in cases:
            before, after = med(detached[label]), med(attached[name][label])
            rows.append(
                {
                    "case": label,
                    "ns_detached": round(before, 1),
                    "ns_attached": round(after, 1),
                    "delta_ns": round(med(deltas[name][label]), 1),
                    "ratio": round(after / before, 2),
                }
            )
        result["variants"][name] = rows
        # The activity record's own cost: per round, the GPU holder's delta minus the
        # non-holder's delta on the same kind of write (both paired with their own baseline).
        record = {}
        for plain, holder in RECORD_PAIRS:
            if plain in deltas[name] and holder in deltas[name]:
                diffs = [
                    h - p for p, h in zip(deltas[name][plain], deltas[name][holder], strict=False)
                ]
                record[holder] = {
                    "median_ns": round(med(diffs), 1),
                    "rounds_ns": [round(d, 1) for d in diffs],
                }
        result.setdefault("record_cost", {})[name] = record
    for huge in (
        "mmap+munmap 4 KiB anon (huge-page probe)",
        "mmap EINVAL (huge-page probe, cheap call)",
    ):
        if {"tracepoint", "tracepoint-nohuge"} <= set(programs) and huge in detached:
            diffs = [
                w - wo
                for w, wo in zip(
                    deltas["tracepoint"][huge], deltas["tracepoint-nohuge"][huge], strict=False
                )
            ]
            base = med(attached["tracepoint-nohuge"][huge])
            result.setdefault("huge_probe_cost", {})[huge] = {
                "median_ns": round(med(diffs), 1),
                "rounds_ns": [round(d, 1) for d in diffs],
                "ratio_to_sensor_without_it": round((base + med(diffs)) / base, 3),
                "ratio_to_no_sensor": round(
                    med(attached["tracepoint"][huge]) / med(detached[huge]), 3
                ),
            }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    if foreign:
        print(
            f"warning: other processes hold BPF programs ({foreign}); their probes skew these figures"
        )
    for name, rows in result["variants"].items():
        print(
            f"\n[{name}]  {args.calls} calls x {args.repeat} rounds; delta = median of paired differences"
        )
        print(f"{'case':<42} {'detached':>9} {'attached':>9} {'delta':>8} {'ratio':>6}")
        for r in rows:
            print(
                f"{r['case']:<42} {r['ns_detached']:>7.1f}ns {r['ns_attached']:>7.1f}ns "
                f"{r['delta_ns']:>+6.1f}ns {r['ratio']:>6.2f}"
            )
        for holder, rc in result["record_cost"].get(name, {}).items():
            print(
                f"  activity record, {holder}: {rc['median_ns']:+.1f} ns per write "
                f"(median of per-round differences {rc['rounds_ns']})"
            )
    for case, hp in result.get("huge_probe_cost", {}).items():
        print(
            f"huge-page probes, {case}: {hp['median_ns']:+.1f} ns per call, ratio "
            f"{hp['ratio_to_sensor_without_it']} to the sensor without them, {hp['ratio_to_no_sensor']} to no sensor "
            f"(per round {hp['rounds_ns']})"
        )
    for v, st in result["startup_s"].items():
        print(
            f"start-up [{v}] (compile + load + attach): median {st['median']} s over {st['runs']}"
        )
    r = result["sensor_rss_mb"]
    print(
        f"RSS: python + bcc {r['before_load']} MB; one sensor loaded {r['one_sensor_loaded']} MB; "
        f"all variants loaded, steady {r['steady_all_loaded']} MB"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
