"""Context-switch and write tax: ``perf bench sched pipe`` with and without the agent (root).

    .venv/bin/python benchmarks/bench_sched_pipe.py [--rounds 5] [--loops 100000]
        [--baseline-tree DIR] [--probe-only] [--json]

Both ends of the pipe are pinned to CPU 0 (``taskset -c 0``): each round trip is two writes,
two reads and two context switches on that CPU, so it fires ``x86_fpu_regs_deactivated``
twice and ``sys_enter_write`` twice.  Each round runs, in turn: nothing of ours; the FPU
rounding-mode probe alone, attached (loaded in this process: what the gate saves while
nothing spins); this tree's agent; and with ``--baseline-tree``, that tree's agent (e.g.
main, whose probe is always attached).  Figures are medians over rounds of µs per round trip
and the ratio to the no-agent runs of the same rounds.  During each agent block the kernel's
BPF statistics give each of the agent's programs' runs and ns per run (its fds, duplicated
with pidfd_getfd), and the agent's status says whether its FPU probe was attached.  Other
engineers' agents on a shared host keep their own probes attached throughout: the baseline
already pays the tracepoints' fixed cost, so the ratios are this agent's own addition.
``--probe-only``: the FPU probe alone, loaded once, attached / detached / not loaded in turn.
"""

from __future__ import annotations

import argparse
import ctypes as ct
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.bench_exec_mix import enable_bpf_stats  # noqa: E402
from gpuguard.sources.ebpf.fpu_probe import FpuProbe  # noqa: E402
from tests.support.agent_run import AgentProcess  # noqa: E402

_LIBC = ct.CDLL(None, use_errno=True)
_NR_PIDFD_OPEN, _NR_PIDFD_GETFD, _NR_BPF = 434, 438, 321
_INFO_LEN, _INFO_NAME, _INFO_RUN_TIME = 256, 64, 192  # struct bpf_prog_info (uapi)


def round_trip_us(loops: int) -> float:
    out = subprocess.run(
        ["taskset", "-c", "0", "perf", "bench", "sched", "pipe", "-l", str(loops)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return next(float(line.split()[0]) for line in out.splitlines() if "usecs/op" in line)


def prog_stats(pid: int) -> dict[str, tuple[int, int]]:
    """{program name: (ns, runs)} of the BPF programs process ``pid`` holds."""
    out: dict[str, tuple[int, int]] = {}
    pidfd = _LIBC.syscall(_NR_PIDFD_OPEN, pid, 0)
    if pidfd < 0:
        return out
    try:
        for fd in os.listdir(f"/proc/{pid}/fdinfo"):
            try:
                with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                    if "prog_id:" not in f.read():
                        continue
            except OSError:
                continue
            mine = _LIBC.syscall(_NR_PIDFD_GETFD, pidfd, int(fd), 0)
            if mine < 0:
                continue
            try:
                info = ct.create_string_buffer(_INFO_LEN)
                attr = (ct.c_uint64 * 3)(mine | (_INFO_LEN << 32), ct.addressof(info))
                if _LIBC.syscall(_NR_BPF, 15, ct.byref(attr), ct.sizeof(attr)) < 0:
                    continue
                name = info.raw[_INFO_NAME : _INFO_NAME + 16].split(b"\0")[0].decode()
                ns, runs = struct.unpack_from("<QQ", info.raw, _INFO_RUN_TIME)
                old = out.get(name, (0, 0))
                out[name] = (old[0] + ns, old[1] + runs)
            finally:
                os.close(mine)
    finally:
        os.close(pidfd)
    return out


def probe_only(rounds: int, loops: int) -> dict:
    """The FPU probe alone, loaded once: attached, detached (the agent's gate while nothing
    spins) and not loaded at all, in turn, ``rounds`` times: µs per round trip, medians."""
    probe = FpuProbe.open()
    rows: dict[str, list[float]] = {"none": [], "attached": [], "detached": []}
    try:
        for _ in range(rounds):
            for label in ("none", "attached", "detached"):
                if label != "none":
                    probe.set_attached(label == "attached")
                rows[label].append(round_trip_us(loops))
                probe.set_attached(False)
        runs_ns = probe.run_stats()
    finally:
        probe.close()
    base = statistics.median(rows["none"])
    out = {
        k: {"median_us": statistics.median(v), "ratio": round(statistics.median(v) / base, 4)}
        for k, v in rows.items()
    }
    if runs_ns and runs_ns[0]:
        out["program"] = {"runs": runs_ns[0], "ns_per_run": round(runs_ns[1] / runs_ns[0], 1)}
    return out


def agent_block(tree: Path | None, loops: int) -> dict:
    wrapper = ("env", "-C", str(tree)) if tree else ()
    with tempfile.TemporaryDirectory(prefix="gg-bench-pipe-") as tmp:
        agent = AgentProcess(Path(tmp), "--sensor", "ebpf", wrapper=wrapper)
        try:
            agent.wait_ready()
            time.sleep(12.0)  # past the first housekeeping pass (the FPU gate)
            before = prog_stats(agent.proc.pid)
            us = round_trip_us(loops)
            after = prog_stats(agent.proc.pid)
            time.sleep(2.5)
            fpu = agent.status().get("counters", {}).get("fpu_probe", {})
        finally:
            agent.stop()
    per_prog = {}
    for name, (ns, runs) in after.items():
        ns0, runs0 = before.get(name, (0, 0))
        if runs - runs0 > 0:
            per_prog[name] = {
                "runs": runs - runs0,
                "ns_per_run": round((ns - ns0) / (runs - runs0), 1),
            }
    return {"us": us, "programs": per_prog, "fpu_attached": fpu.get("attached", "always")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--loops", type=int, default=100000)
    parser.add_argument("--baseline-tree", type=Path)
    parser.add_argument("--probe-only", action="store_true", help="the FPU probe alone")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    stats = enable_bpf_stats()
    if args.probe_only:
        try:
            print(json.dumps({"load": os.getloadavg()[0], **probe_only(args.rounds, args.loops)}))
        finally:
            if stats is not None:
                os.close(stats)
        return 0
    rows: dict[str, list] = {"none": [], "fpu probe alone": [], "agent (this tree)": []}
    if args.baseline_tree:
        rows["agent (baseline tree)"] = []
    loads = []
    try:
        for _ in range(args.rounds):
            loads.append(os.getloadavg()[0])
            rows["none"].append(round_trip_us(args.loops))
            probe = FpuProbe.open()
            try:
                rows["fpu probe alone"].append(
                    round_trip_us(args.loops) if probe.attached else None
                )
            finally:
                probe.close()
            rows["none"].append(round_trip_us(args.loops))
            rows["agent (this tree)"].append(agent_block(None, args.loops))
            if args.baseline_tree:
                rows["agent (baseline tree)"].append(agent_block(args.baseline_tree, args.loops))
    finally:
        if stats is not None:
            os.close(stats)
    base = statistics.median(rows["none"])
    result = {"load": [round(x, 1) for x in loads], "none_us": base, "rows": {}}
    for label, values in rows.items():
        us = [v["us"] if isinstance(v, dict) else v for v in values if v is not None]
        row = {"median_us": statistics.median(us), "ratio": round(statistics.median(us) / base, 4)}
        row["ratios_by_round"] = [round(u / base, 3) for u in us]
        blocks = [v for v in values if isinstance(v, dict)]
        if blocks:
            row["fpu_attached"] = [b["fpu_attached"] for b in blocks]
            names = {n for b in blocks for n in b["programs"]}
            row["programs"] = {
                n: {
                    "runs_per_trip": round(
                        statistics.median(b["programs"].get(n, {}).get("runs", 0) for b in blocks)
                        / args.loops,
                        2,
                    ),
                    "ns_per_run": statistics.median(
                        b["programs"].get(n, {}).get("ns_per_run", 0) for b in blocks
                    ),
                }
                for n in sorted(names)
            }
        result["rows"][label] = row
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"load average per round: {result['load']}; no agent: {base:.3f} µs per round trip")
    print("| what runs | µs per round trip (median) | vs none | per round |")
    print("|---|---:|---:|---|")
    for label, row in result["rows"].items():
        print(
            f"| {label} | {row['median_us']:.3f} | {row['ratio']:.3f} | "
            f"{', '.join(f'{r:.3f}' for r in row['ratios_by_round'])} |"
        )
    for label, row in result["rows"].items():
        if "programs" in row:
            print(f"\n{label}: FPU probe attached per block: {row['fpu_attached']}")
            print("| program | runs per round trip | ns per run |")
            print("|---|---:|---:|")
            for name, p in row["programs"].items():
                if p["runs_per_trip"] >= 0.01:
                    print(f"| {name} | {p['runs_per_trip']:.2f} | {p['ns_per_run']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
