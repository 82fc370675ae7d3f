"""Precision: miner stand-ins and busy benign workers together, under the agent and under scan.

Usage (as root, from the repository root, on a host set up by packaging/setup-host.sh):

    .venv/bin/python benchmarks/bench_precision.py [--agent-s 300] [--scan-after-s 180] [--tree DIR]

One host, one run: Debian's memcached, beanstalkd, redis-server and PostgreSQL as nobody, six
busy workers holding quiet sessions to them (tests/support/busy_workers.py: Python and C,
compression, hashing, numeric code, as nobody), and the miners: the RandomX stand-in
(tests/support/randomx.py) over plain TCP, over TLS without SNI, throttled (nice 19, one
thread) and as nobody over TLS, and the selftest's GPU miner simulator (stratum and a wallet on
its command line).  Nothing is shortened: the shipped rules, their two-minute windows, jobs
handed out every 10-60 s, a cache heartbeat a minute.

An agent (`gpuguard agent`, eBPF sensor, monitor mode, shipped rules) watches from before the
first workload for ``--agent-s``; ``gpuguard scan --json`` runs once ``--scan-after-s`` after the
workloads started.  ``--tree DIR`` (another checkout, e.g. main exported with `git archive`)
runs its agent and its scan beside this one's on the same processes: before and after in one
run, under one load.  Printed: per process and per tree, the agent's worst verdict and the
scan's, with the rules that decided them (weights; "capped" where generic evidence was held
below suspicious), then detection and false-positive rates.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpuguard.proving.simulator import parse_ready, start_simulator, stop_simulator  # noqa: E402
from tests.support.busy_workers import (  # noqa: E402
    CORPUS,
    Servers,
    remove_installed,
    start_worker,
)
from tests.support.processes import terminate  # noqa: E402
from tests.support.randomx import (  # noqa: E402
    INSTALL_DIR,
    LoopbackPool,
    start_standin,
    stop,
)

RANK = {"clean": 0, "suspicious": 1, "malicious": 2}


def _agent(tree: Path, workdir: Path, label: str) -> tuple[subprocess.Popen, Path]:
    """``gpuguard agent`` of ``tree`` with its shipped rules (copied root-only), logging to a file."""
    rules = workdir / f"rules-{label}"
    shutil.copytree(tree / "rules", rules)
    rules.chmod(0o700)
    for path in rules.rglob("*"):  # an exported tree may carry group-writable files
        path.chmod(path.stat().st_mode & ~0o022)
    log = workdir / f"agent-{label}.log"
    argv = [sys.executable, "-m", "gpuguard", "agent", "--sensor", "ebpf", "--log", str(log)]
    argv += ["--state-file", str(workdir / f"status-{label}.json")]
    argv += ["--rules", str(rules / "miner-rules.yaml")]
    env = dict(os.environ, PYTHONPATH=str(tree))
    proc = subprocess.Popen(
        argv, cwd=tree, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=open(workdir / f"agent-{label}.stderr", "wb"),
    )  # fmt: skip
    status = workdir / f"status-{label}.json"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            if json.loads(status.read_text()).get("running"):
                return proc, log
        except (OSError, ValueError):
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    raise RuntimeError(
        f"agent of {tree} did not start: {(workdir / f'agent-{label}.stderr').read_text()[-800:]}"
    )


def _scan(tree: Path, workdir: Path, label: str) -> dict:
    rules = workdir / f"rules-{label}" / "miner-rules.yaml"
    run = subprocess.run(
        [sys.executable, "-m", "gpuguard", "scan", "--json", "--no-yara", "--rules", str(rules)],
        cwd=tree, env=dict(os.environ, PYTHONPATH=str(tree)), capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    return json.loads(run.stdout)


def _rules_of(gg: dict) -> str:
    parts = [f"{e['rule_id']} {e['weight']:+g}" for e in gg.get("evidence", [])]
    if gg.get("score_capped"):
        parts.append(f"capped from {gg['score_cap']['uncapped_score']}")
    return ", ".join(parts) or "-"


def _agent_view(log: Path, pid: int) -> tuple[str, str]:
    """The worst verdict the agent's records gave ``pid`` and that record's evidence."""
    worst, rules = "clean", "no finding"
    for line in log.read_text().splitlines() if log.exists() else []:
        record = json.loads(line)
        gg = record.get("gpuguard", {})
        if gg.get("kind") != "process" or record.get("process", {}).get("pid") != pid:
            continue
        if RANK.get(gg.get("verdict"), 0) >= RANK[worst]:
            worst, rules = gg["verdict"], _rules_of(gg)
    return worst, rules


def _scan_view(doc: dict, pid: int) -> tuple[str, str]:
    for finding in doc.get("findings", []):
        if finding.get("process", {}).get("pid") == pid:
            gg = finding["gpuguard"]
            return gg["verdict"], f"{gg['score']:g}: {_rules_of(gg)}"
    return "clean", "no evidence"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agent-s", type=float, default=300.0)
    parser.add_argument("--scan-after-s", type=float, default=180.0)
    parser.add_argument("--tree", type=Path, action="append", default=[])
    args = parser.parse_args()
    trees = {"this": REPO} | {f"tree{i}": t.resolve() for i, t in enumerate(args.tree, 1)}
    procs: dict[str, tuple[str, int]] = {}  # name -> (kind, pid)
    started: list = []
    agents: dict[str, tuple[subprocess.Popen, Path]] = {}
    sims = []
    with tempfile.TemporaryDirectory(prefix="gg-precision-") as tmp:
        workdir = Path(tmp)
        pool = LoopbackPool(workdir, tls=True, push_s=(10, 120))
        plain_pool = LoopbackPool(workdir, tls=False, push_s=(10, 120))
        try:
            with Servers(push_s=(10, 60)) as servers:
                for label, tree in trees.items():
                    agents[label] = _agent(tree, workdir, label)
                t0 = time.monotonic()
                for worker in CORPUS:
                    proc = start_worker(worker, servers)
                    started.append(proc)
                    procs[f"{worker.name} ({worker.language}, {worker.server}, {worker.work})"] = (
                        "benign",
                        proc.pid,
                    )
                variants = {
                    "randomx stand-in, plain TCP": dict(pool=plain_pool, name="nodestatd"),
                    "randomx stand-in, TLS no SNI": dict(pool=pool, name="metricsd"),
                    "randomx stand-in, nice 19, 1 thread": dict(
                        pool=pool, name="syncagent", nice=19, threads=1
                    ),
                    "randomx stand-in, nobody, TLS": dict(
                        pool=pool, name="cachewarm", user="nobody"
                    ),
                }
                for label, kwargs in variants.items():
                    proc = start_standin(kwargs.pop("pool"), submit_s=30, **kwargs)
                    started.append(proc)
                    procs[label] = ("miner", proc.pid)
                sim = start_simulator()
                sims.append(sim)
                procs["GPU miner simulator (stratum, wallet)"] = (
                    "miner",
                    int(parse_ready(sim.stdout.readline().decode())["pid"]),
                )
                time.sleep(max(0.0, args.scan_after_s - (time.monotonic() - t0)))
                scans = {label: _scan(tree, workdir, label) for label, tree in trees.items()}
                time.sleep(max(0.0, args.agent_s - (time.monotonic() - t0)))
                for proc, _ in agents.values():
                    terminate(proc, 30)
                alive = {name: os.path.exists(f"/proc/{pid}") for name, (_, pid) in procs.items()}
        finally:
            for sim in sims:
                stop_simulator(sim)
            for proc in started:
                stop(proc)
            for proc, _ in agents.values():
                if proc.poll() is None:
                    terminate(proc, 30)
            pool.close()
            plain_pool.close()
            remove_installed()
            shutil.rmtree(INSTALL_DIR, ignore_errors=True)
        print(f"agent watched {args.agent_s:g} s; scan {args.scan_after_s:g} s after the start")
        for label in trees:
            log = agents[label][1]
            print(f"\n## {label}: {trees[label]}\n")
            print(
                "| process | kind | agent | agent's deciding rules | scan | scan's score and rules |"
            )
            print("|---|---|---|---|---|---|")
            rates = {k: {"agent": 0, "scan": 0, "n": 0} for k in ("miner", "benign")}
            for name, (kind, pid) in procs.items():
                a_verdict, a_rules = _agent_view(log, pid)
                s_verdict, s_rules = _scan_view(scans[label], pid)
                rate = rates[kind]
                rate["n"] += 1
                rate["agent"] += a_verdict != "clean"
                rate["scan"] += s_verdict != "clean"
                gone = "" if alive[name] else " (exited)"
                print(
                    f"| {name}{gone} | {kind} | {a_verdict} | {a_rules} | {s_verdict} | {s_rules} |"
                )
            summary = scans[label].get("summary", {})
            for line in summary.get("could_not_see", []):
                print(f"scan could not see: {line}")
            for kind, word in (("miner", "detection"), ("benign", "false-positive")):
                rate = rates[kind]
                print(
                    f"{word} rate ({kind}s at suspicious or above): agent "
                    f"{rate['agent']}/{rate['n']} = {rate['agent'] / rate['n']:.0%}, scan "
                    f"{rate['scan']}/{rate['n']} = {rate['scan'] / rate['n']:.0%}"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
