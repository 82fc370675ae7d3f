"""Memory the correlator and engine hold under process churn (tracemalloc, in-process, no sensor).

    .venv/bin/python benchmarks/bench_correlate_memory.py [--rate 100] [--seconds 60] [--top 12] [--json]

A synthetic stream, in stream time: ``--rate`` short-lived processes start
per second (exec, /proc facts copied from this process's own, exit 50 ms
later); one in ten of them also opens a GPU, one in ten connects out and one
in fifty is named ``xmrig`` (evidence);
20 long-lived processes get a GPU sample every second.  The engine (shipped
rules) scores every 0.25 s and the correlator expires every 10 s, as the
agent's loop does.  The same stream runs twice in this process:

* ``baseline``: every exited process kept for the 30 s exit grace (the rule
  before the short grace for clean processes: ``clean_exit_grace_s = 30``);
* ``current``: the correlator's defaults.

Each run reports the traced memory the stream left (after the last expiry),
the processes tracked and the bytes per tracked process, and checks that both
runs gave every process the same verdict and score.  ``--top`` lists the allocation
sites of the current run.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import sys
import tracemalloc
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpuguard.correlate.correlator import Correlator  # noqa: E402
from gpuguard.detect.ruleset.load import load_ruleset  # noqa: E402
from gpuguard.detect.ruleset.shipped import shipped_rules_file  # noqa: E402
from gpuguard.detect.scoring.engine import DetectionEngine  # noqa: E402
from gpuguard.events.gpu_snapshot import GpuSnapshot, ProcessGpuUsage  # noqa: E402
from gpuguard.events.model import Connect, Exec, Exit, GpuOpen  # noqa: E402
from gpuguard.sources.proc.process import collect_process_facts  # noqa: E402

T0 = 1_700_000_000.0
LONG_LIVED = 20
FIRST_PID = 200_000


def stream(rate: int, seconds: int):
    """(time, item) in time order: see the module docstring."""
    items = []
    for n in range(rate * seconds):
        pid, start = FIRST_PID + n, T0 + n / rate
        items.append(
            (
                start,
                Exec(
                    time=start,
                    pid=pid,
                    comm="sleep",
                    filename="/usr/bin/sleep",
                    cmdline=["/bin/sleep", "0.05"],
                    ppid=os.getpid(),
                ),
            )
        )
        if n % 10 == 3:
            items.append(
                (
                    start + 0.01,
                    GpuOpen(
                        time=start + 0.01,
                        pid=pid,
                        path="/dev/nvidia0",
                        device_class="nvidia",
                        comm="sleep",
                    ),
                )
            )
        if n % 10 == 7:
            items.append(
                (
                    start + 0.01,
                    Connect(time=start + 0.01, pid=pid, address="10.1.2.3", port=443, comm="sleep"),
                )
            )
        items.append((start + 0.05, Exit(time=start + 0.05, pid=pid, exit_code=0)))
    for second in range(seconds):
        usage = [
            ProcessGpuUsage(
                vendor="nvidia",
                device_index=i % 8,
                pid=1000 + i,
                sm_util=40.0 + i,
                used_memory=(1 << 30) + i,
            )
            for i in range(LONG_LIVED)
        ]
        items.append((T0 + second, GpuSnapshot(time=T0 + second, source="nvml", processes=usage)))
    items.sort(key=lambda pair: pair[0])
    return items


def run(items, rules, rate: int, **correlator_options) -> dict:
    base = collect_process_facts(os.getpid())

    def facts_of(pid: int):
        if pid < FIRST_PID:  # a long-lived GPU user
            return dataclasses.replace(base, pid=pid, start_time=T0 - 100, comm=f"trainer{pid}")
        start = T0 + (pid - FIRST_PID) / rate
        name = "xmrig" if (pid - FIRST_PID) % 50 == 11 else "sleep"  # some evidence to keep
        return dataclasses.replace(
            base,
            pid=pid,
            start_time=round(start, 2),
            comm=name,
            exe=f"/usr/bin/{name}",
            cmdline=[f"/bin/{name}", "0.05"],
            ppid=os.getpid(),
            ancestors=list(base.ancestors),
        )

    gc.collect()
    tracemalloc.start(1)
    before = tracemalloc.take_snapshot()
    correlator = Correlator(facts_provider=facts_of, **correlator_options)
    engine = DetectionEngine(correlator, rules)
    verdicts: dict = {}
    next_score, next_expiry = T0, T0 + 10
    for time, item in items:
        correlator.feed(item)
        if time >= next_score:
            next_score = time + 0.25
            for verdict in engine.score(time):
                verdicts[f"{verdict.pid}@{verdict.key.start_time}"] = (
                    verdict.verdict,
                    verdict.score,
                )
        if time >= next_expiry:
            next_expiry = time + 10
            correlator.expire(time)
    for verdict in engine.score(time + 1):
        verdicts[f"{verdict.pid}@{verdict.key.start_time}"] = (verdict.verdict, verdict.score)
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    not_ours = [
        tracemalloc.Filter(False, __file__)
    ]  # the verdicts dict (its own strings) is the benchmark's
    diff = after.filter_traces(not_ours).compare_to(before.filter_traces(not_ours), "lineno")
    traced = sum(d.size_diff for d in diff)
    tracked = len(correlator)
    return {
        "traced_mb": traced / 1e6,
        "tracked": tracked,
        "bytes_per_tracked": traced / max(1, tracked),
        "expired": correlator.counters["expired"],
        "verdicts": verdicts,
        "top": [
            (
                d.size_diff,
                d.count_diff,
                f"{Path(d.traceback[0].filename).name}:{d.traceback[0].lineno}",
            )
            for d in diff[:40]
        ],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rate", type=int, default=100, help="process starts per second of stream time"
    )
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rules = load_ruleset([shipped_rules_file()])
    items = stream(args.rate, args.seconds)
    baseline = run(items, rules, args.rate, clean_exit_grace_s=30.0)
    current = run(items, rules, args.rate)
    same = baseline["verdicts"] == current["verdicts"]
    flagged = sum(1 for _, score in current["verdicts"].values() if score)
    result = {
        "rate": args.rate,
        "seconds": args.seconds,
        "same_verdicts": same,
        "processes_scored": len(current["verdicts"]),
        "scored_above_0": flagged,
        "ratio_traced": current["traced_mb"] / baseline["traced_mb"],
    }
    for name, data in (("baseline", baseline), ("current", current)):
        result[name] = {k: v for k, v in data.items() if k not in ("verdicts", "top")}
    result["top_current"] = current["top"][: args.top]
    if args.json:
        print(json.dumps(result, indent=2))
        return 0 if same else 1
    for name in ("baseline", "current"):
        data = result[name]
        print(
            f"{name:9s}: {data['traced_mb']:6.2f} MB traced, {data['tracked']:5d} processes tracked, "
            f"{data['bytes_per_tracked']:6.0f} B per tracked process, {data['expired']} expired"
        )
    print(
        f"current / baseline: {result['ratio_traced']:.3f} of the memory; same verdicts for all "
        f"{result['processes_scored']} processes: {same} ({flagged} scored above 0)"
    )
    print(f"top allocation sites (current run, {args.rate} starts/s for {args.seconds} s):")
    for size, count, where in result["top_current"]:
        print(f"  {size / 1e3:9.1f} kB {count:7d} blocks  {where}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
