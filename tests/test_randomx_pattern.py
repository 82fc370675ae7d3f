"""RandomX's rounding-mode pattern on the real kernel: a verdict only RandomX earns.

One enforce agent (eBPF sensor, FPU probe), confined to a cgroup this test made, watches at
once: the string-free RandomX stand-in (tests/workloads/randomx_standin.c: all four modes at
random in one spinning thread, TLS to a loopback pool that pushes jobs, no SNI, no strings)
run as nobody in three disguises (unthrottled; in a cgroup limited to 0.3 of a core; under a
SIGSTOP/SIGCONT duty cycle, as cpulimit throttles), outside that cgroup; and inside it, the
benign rounding-mode users of tests/workloads/rounding_benign.c: interval arithmetic on a busy
core working a job queue with a heartbeat every 30 s, set-once code, and a libm test suite
stepping through the modes (short and long tables).  Each stand-in must be malicious within
60 s and flagged by `gpuguard scan` after 20 s of running (the rules' windows shortened
six-fold, tests/support/short_windows.py: RandomX's 30 s of spinning is 10 s, a job-queue
worker's quiet session is judged after 20 s, not two minutes); each benign program stays below
suspicious in both, is never acted on and keeps working; the stand-ins outside the cgroup
are refused any action and live on until their verdicts are in (then they stop, leaving the
CPU to the benign programs, which are watched to twice the longest window they could meet:
the 20 s quiet session, so a heartbeat sent at 30 s is inside the watch, and on until a probe
of the test's own has looked at each of them MIN_LOOKS times, a minute more at most).  That
probe checks that the benign programs did leave round-to-nearest (the verdicts are about real
switching, not silence).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import pytest

from gpuguard.events.rounding_modes import MIN_LOOKS, FpuCounts, rounding_pattern
from gpuguard.proving.enforce_scope import EnforceScope
from gpuguard.sources.ebpf.fpu_probe import FpuProbe
from tests.support.agent_run import REPO, AgentProcess, actions_on, finding_for
from tests.support.load import own_cpu_group
from tests.support.randomx import INSTALL_DIR, LoopbackPool, start_standin, stop
from tests.support.rounding import (
    DutyCycle,
    JobQueue,
    cpu_time_s,
    start_benign,
)
from tests.support.scan import findings_for_pid
from tests.support.short_windows import rules_args, short_window_rules, shortened

DEADLINE_S = 60.0
SCAN_AFTER_S = 20.0
BENIGN_WATCH_S = 2 * shortened(120)  # the quiet-session rule's window, twice
LOOKS_GRACE_S = 60.0  # past the watch, for the probe's looks at a benign program
ALERT = ("suspicious", "malicious")

pytestmark = [pytest.mark.root, pytest.mark.host_mutator]


def _looked_enough(seen: FpuCounts | None) -> bool:
    return seen is not None and seen.samples >= MIN_LOOKS


def _verdicts(records: list[dict], pid: int) -> list[str]:
    return [r["gpuguard"]["verdict"] for r in records if finding_for(pid)(r)]


def _scan(*rules: str) -> dict:
    run = subprocess.run(
        [sys.executable, "-m", "gpuguard", "scan", "--json", "--no-yara", *rules],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode in (0, 1), run.stderr[-2000:]
    return json.loads(run.stdout)


def _scan_verdict(doc: dict, pid: int) -> tuple[str, float, set[str]]:
    """(verdict, score, rule ids) of scan's finding about ``pid``; no finding: clean, 0."""
    for finding in findings_for_pid(doc, pid):
        g = finding["gpuguard"]
        return g["verdict"], g["score"], set(g["rule_ids"])
    return "clean", 0.0, set()


def _epoch(timestamp: str) -> float:
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def _config(workdir: Path, scope: EnforceScope) -> Path:
    path = workdir / "agent.yaml"
    path.write_text("mode: enforce\nsensor: ebpf\n" + scope.response_section())
    path.chmod(0o600)
    return path


def test_only_randomx_is_convicted_in_the_agent_in_scan_and_in_enforce_mode():
    probe = FpuProbe.open()
    assert probe.loaded, probe.blind_spot
    procs: list[subprocess.Popen] = []
    duty: DutyCycle | None = None
    with (
        tempfile.TemporaryDirectory(prefix="gg-rx-pattern-") as tmp,
        EnforceScope(Path(tmp)) as scope,
        own_cpu_group(cores=0.3) as quota_procs,
    ):
        assert quota_procs is not None, "no cpu controller to hold a stand-in to 0.3 of a core"
        workdir = Path(tmp)
        workdir.chmod(0o700)
        pool = LoopbackPool(workdir, tls=True, push_s=(10, 40))
        queue = JobQueue()
        rules = rules_args(short_window_rules(workdir))
        agent = AgentProcess(workdir, "--config", str(_config(workdir, scope)), *rules)
        try:
            status = agent.wait_ready()
            assert not any("rounding-mode" in b for b in status.get("blind_spots", [])), status
            benign = {
                "interval": start_benign(
                    "interval", "boundsolve", queue=queue, cgroup_v2=scope.cgroup
                ),
                "set-once": start_benign("set-once", "lowerbound", cgroup_v2=scope.cgroup),
                "stepping": start_benign("stepping", "libm-tests", cgroup_v2=scope.cgroup),
                "stepping-slow": start_benign("stepping-slow", "fp-suite", cgroup_v2=scope.cgroup),
            }
            procs += benign.values()
            # the stand-ins at an ordinary task's weight (see test_randomx_agent.py), as nobody
            standins = {
                variant: start_standin(
                    pool,
                    name,
                    threads=1,
                    memory_mib=64,
                    submit_s=15,
                    low_weight=False,
                    user="nobody",
                )
                for variant, name in (
                    ("nobody", "nodestatd"),
                    ("cpu-quota", "metricsd"),
                    ("stop-cont", "syncagent"),
                )
            }
            started = time.time()
            procs += standins.values()
            quota_procs.write_text(str(standins["cpu-quota"].pid))
            duty = DutyCycle(standins["stop-cont"], on_s=0.1, off_s=0.1)

            time.sleep(max(0.0, started + SCAN_AFTER_S - time.time()))
            scan_started = time.time()
            scan = _scan(*rules)
            scan_s = time.time() - scan_started

            found: dict[str, tuple[float, set[str]]] = {}
            for variant, proc in standins.items():
                left = max(1.0, DEADLINE_S - (time.time() - started))
                record = agent.wait_record(
                    lambda r, pid=proc.pid: (
                        finding_for(pid)(r) and r["gpuguard"]["verdict"] == "malicious"
                    ),
                    timeout=left,
                )
                # when the agent wrote it (this loop starts after the scan)
                seen_at = _epoch(record["@timestamp"]) - started
                found[variant] = (seen_at, set(record["gpuguard"]["rule_ids"]))
                print(f"agent: {variant} malicious after {seen_at:.0f} s", found[variant][1])
            # the stand-ins lived to their verdicts (and any action on them): now they go
            time.sleep(1.0)
            alive = {name: p.poll() is None for name, p in standins.items()}
            duty.stop()
            duty = None
            for proc in standins.values():
                stop(proc)
            # the benign programs keep working to the end of their watch
            work_before = {name: cpu_time_s(p.pid) for name, p in benign.items()}
            done_before = queue.lines.get("DONE", 0)
            time.sleep(max(15.0, started + BENIGN_WATCH_S - time.time()))
            # ... and until the probe has looked at each of them enough to judge it: the
            # probe samples at preemption, which comes slower once the stand-ins are gone
            counts = probe.counts()
            look_until = time.time() + LOOKS_GRACE_S
            while time.time() < look_until and not all(
                _looked_enough(counts.get(p.pid)) for p in benign.values()
            ):
                time.sleep(2.0)
                counts = probe.counts()
            records = agent.records()
            alive |= {name: p.poll() is None for name, p in benign.items()}
            work_after = {name: cpu_time_s(p.pid) for name, p in benign.items()}
            done_after = queue.lines.get("DONE", 0)
        finally:
            if duty is not None:
                duty.stop()
            for proc in procs:
                stop(proc)
            agent.stop()
            pool.close()
            queue.close()
            probe.close()
            shutil.rmtree(INSTALL_DIR, ignore_errors=True)

    print(
        f"scan ran {scan_s:.1f} s; window {scan['scanner']['options']['cpu_window_observed_s']} s"
    )
    for variant, proc in standins.items():
        seen_at, rules = found[variant]
        assert seen_at <= DEADLINE_S + 5, (variant, seen_at)
        assert {"cpu-fpu-rounding-random", "cpu-randomx-miner"} <= rules, (variant, rules)
        assert not rules & {"yara-miner", "net-pool-protocol", "miner-binary-name"}, rules
        verdict, score, scan_rules = _scan_verdict(scan, proc.pid)
        print(f"scan: {variant} {verdict} {score}", sorted(scan_rules))
        assert verdict in ALERT and "cpu-fpu-rounding-random" in scan_rules, (variant, scan_rules)
        # outside the response scope: found, never acted on, still running
        actions = actions_on(records, proc.pid)
        assert all(a["gpuguard"]["status"] == "refused" for a in actions), actions
        assert alive[variant], f"{variant} did not survive outside the scope"
    for name, proc in benign.items():
        assert not [v for v in _verdicts(records, proc.pid) if v in ALERT], name
        assert not actions_on(records, proc.pid), name
        verdict, score, scan_rules = _scan_verdict(scan, proc.pid)
        print(f"scan: {name} {verdict} {score}", sorted(scan_rules))
        assert verdict == "clean", (name, score, scan_rules)
        assert alive[name] and work_after[name] > work_before[name], f"{name} stopped working"
        seen = counts.get(proc.pid)
        assert _looked_enough(seen) and seen.nondefault, (name, seen)
        pattern = rounding_pattern(seen.modes, seen.transitions)
        print(f"probe: {name}", seen.modes, pattern)
        assert pattern is not None and not pattern.random, (name, pattern)
    assert done_after > done_before, "the job-queue worker stopped reporting"
