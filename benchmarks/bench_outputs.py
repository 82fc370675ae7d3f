"""Cost of the agent's outputs per record, as ratios to a baseline measured in the same run.

    .venv/bin/python benchmarks/bench_outputs.py [--records 20000] [--rounds 3]

Baseline: ``json.dumps`` of an already-built ECS document for a real finding (the
miner_stratum_cmdline golden case: 13 pieces of evidence, the heaviest record the
agent writes).  Measured:

* rendering one finding as an ECS / OCSF / CEF line (``RecordRenderer.line``);
* ``LogWriter.write`` as the caller sees it (render + enqueue; the disk write is on the
  writer's thread) and end to end to a file (write + flush);
* ``AgentMetrics.sync_totals`` (one more finding counted) and ``observe_snapshot`` (8 GPUs,
  64 GPU processes).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpuguard.detect.cases import replay
from gpuguard.detect.ruleset.load import load_ruleset
from gpuguard.detect.ruleset.shipped import shipped_rules_file
from gpuguard.events.gpu_snapshot import DeviceSample, GpuSnapshot, ProcessGpuUsage
from gpuguard.outputs.ecs import finding_to_ecs, host_fields
from gpuguard.outputs.finding import finding_from_verdict
from gpuguard.outputs.log_writer import open_log
from gpuguard.outputs.metrics import AgentMetrics
from gpuguard.outputs.records import FORMATS, RecordRenderer


def per_call_us(fn, n: int, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, time.perf_counter() - started)
    return best / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})

    ruleset = load_ruleset([shipped_rules_file()])
    verdicts, correlator = replay(
        Path(__file__).resolve().parent.parent
        / "tests"
        / "cases"
        / "miner_stratum_cmdline"
        / "capture.ggrec",
        ruleset,
    )
    verdict = max(verdicts, key=lambda v: v.score)
    state = correlator.get(verdict.key)
    finding = finding_from_verdict(verdict, state.facts, ruleset, state)
    host = host_fields()
    document = finding_to_ecs(finding, finding.created, host, dataset="gpuguard.agent")
    n, rounds = args.records, args.rounds

    baseline = per_call_us(
        lambda: json.dumps(document, ensure_ascii=False, separators=(",", ":")), n, rounds
    )
    rows = [("json.dumps of a built ECS document (baseline)", baseline)]
    for fmt in FORMATS:
        renderer = RecordRenderer(fmt, host)
        rows.append(
            (f"render a finding: {fmt}", per_call_us(lambda r=renderer: r.line(finding), n, rounds))
        )

    with tempfile.TemporaryDirectory() as tmp:
        writer = open_log(
            os.path.join(tmp, "events.json"), "ecs", queue_size=n + 1, host=host, max_bytes=1 << 34
        )
        rows.append(
            (
                "LogWriter.write, caller side (render + enqueue)",
                per_call_us(lambda: writer.write(finding), n, 1),
            )
        )
        writer.flush(60)
        started = time.perf_counter()
        for _ in range(n):
            writer.write(finding)
        writer.flush(60)
        rows.append(("LogWriter to a file, end to end", (time.perf_counter() - started) / n * 1e6))
        writer.close()

    metrics = AgentMetrics()
    # The agent counts a finding in its own totals and hands them to the metrics whole
    # (AgentMetrics.sync_totals): here each call syncs totals with one more finding.
    findings = {f"{finding.rule_id}/{finding.verdict}": 0}

    def one_more_finding() -> None:
        for key in findings:
            findings[key] += 1
        metrics.sync_totals({"findings": findings})

    rows.append(
        (
            "AgentMetrics.sync_totals, one more finding",
            per_call_us(one_more_finding, n, rounds),
        )
    )
    snapshot = GpuSnapshot(
        time=1.0,
        source="nvml",
        devices=[
            DeviceSample(
                "nvidia",
                i,
                "NVIDIA H100 80GB HBM3",
                gpu_util=97.0,
                memory_used=1 << 34,
                memory_total=80 << 30,
                power_w=650.0,
            )
            for i in range(8)
        ],
        processes=[
            ProcessGpuUsage(1000 + p, "nvidia", p % 8, sm_util=float(p), used_memory=p << 20)
            for p in range(64)
        ],
    )
    rows.append(
        (
            "AgentMetrics.observe_snapshot (8 GPUs, 64 processes)",
            per_call_us(lambda: metrics.observe_snapshot(snapshot), max(1, n // 20), rounds),
        )
    )

    size = len(RecordRenderer("ecs", host).line(finding))
    print(
        f"finding: {len(finding.evidence)} pieces of evidence, ECS line {size} bytes; {n} records, best of {rounds}"
    )
    print("| measured | µs per call | vs baseline |\n|---|---:|---:|")
    for name, us in rows:
        print(f"| {name} | {us:.1f} | {us / baseline:.2f}× |")


if __name__ == "__main__":
    main()
