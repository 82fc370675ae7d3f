"""False positives seen on real hosts: sealed-memfd runtime helpers and renamed runtime workers.

The memfd case runs for real: a process re-executes ``sleep`` from a sealed
memfd named like the runtime helper (``/memfd:sealed-… (deleted)``), its
facts are collected from /proc and scored with the shipped rules.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time

import pytest

from gpuguard.correlate.correlator import Correlator
from gpuguard.detect.ruleset.load import load_ruleset
from gpuguard.detect.ruleset.shipped import shipped_rules_file
from gpuguard.detect.scoring.engine import DetectionEngine
from gpuguard.events.model import Connect
from gpuguard.events.process_facts import Ancestor, ProcessFacts
from gpuguard.sources.proc.process import collect_process_facts

T = 1_795_305_600.0

# Copies /bin/sleep into a sealed memfd and fexecve()s it, like runc's self-clone.
SEALED_EXEC = r"""
import fcntl, os, sys
fd = os.memfd_create(sys.argv[1], os.MFD_ALLOW_SEALING)
with open("/bin/sleep", "rb") as f:
    os.write(fd, f.read())
fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE)
os.execve(fd, ["sleep", "60"], dict(os.environ))   # fexecve: comm becomes "memfd:NAME", as the runtime's
"""


@pytest.fixture(scope="module")
def ruleset():
    return load_ruleset([shipped_rules_file()])


def _sealed_process(name: str):
    proc = subprocess.Popen([sys.executable, "-c", SEALED_EXEC, name])
    deadline = time.time() + 5
    while time.time() < deadline and not os.readlink(f"/proc/{proc.pid}/exe").startswith("/memfd:"):
        time.sleep(0.01)
    return proc


def _verdict(ruleset, facts, *events):
    c = Correlator(facts_provider=None)
    engine = DetectionEngine(c, ruleset)
    c.feed(facts)
    for event in events:
        c.feed(event)
    return next(v for v in engine.verdicts(T + 100) if v.pid == facts.pid), engine


def test_a_real_sealed_memfd_runtime_helper_is_named_not_suspicious(ruleset):
    proc = _sealed_process("sealed-91173221a7ea")
    try:
        facts = collect_process_facts(proc.pid)
        assert facts.exe_memfd and facts.exe_deleted and facts.exe == "/memfd:sealed-91173221a7ea"
        verdict, engine = _verdict(ruleset, facts)
        assert verdict.verdict == "clean" and verdict.score == 5
        assert [e.rule_id for e in verdict.evidence] == ["exe-memfd-runtime-named"]
        # its children no longer inherit a suspicious parent
        child = ProcessFacts(
            pid=proc.pid + 100_000,
            start_time=facts.start_time + 1,
            ppid=proc.pid,
            comm="sh",
            exe="/usr/bin/dash",
            cmdline=["sh", "-c", "true"],
            ancestors=[Ancestor(proc.pid, facts.comm, facts.exe)],
        )
        engine.correlator.feed(child)
        child_verdict = next(v for v in engine.verdicts(T + 100) if v.pid == child.pid)
        assert child_verdict.verdict == "clean" and child_verdict.evidence == []
    finally:
        proc.kill()
        proc.wait()


def test_fileless_needs_a_second_indicator(ruleset):
    proc = _sealed_process("payload")
    try:
        facts = collect_process_facts(proc.pid)
        alone, _ = _verdict(ruleset, facts)
        assert (alone.score, alone.verdict, [e.rule_id for e in alone.evidence]) == (
            25,
            "clean",
            ["exe-memfd"],
        )
        with_pool, _ = _verdict(
            ruleset, facts, Connect(time=T + 1, pid=proc.pid, address="10.1.2.3", port=3333)
        )
        assert with_pool.verdict == "suspicious" and {"exe-memfd", "net-pool-port"} <= {
            e.rule_id for e in with_pool.evidence
        }
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize(
    "comm,exe",
    [
        ("pt_data_worker", "/usr/bin/python3.12"),
        ("ray::IDLE", "/opt/conda/bin/python3.11"),
        ("dask-worker", "/usr/bin/python3"),
        ("gunicorn", "/usr/bin/python3.11"),
    ],
)
def test_renamed_runtime_workers_do_not_accumulate_score(ruleset, comm, exe):
    facts = ProcessFacts(pid=2440, start_time=T, comm=comm, exe=exe, cmdline=[exe, "-m", "worker"])
    verdict, _ = _verdict(ruleset, facts)
    assert verdict.score == 0, verdict.explain()


def test_a_miner_calling_itself_pt_data_worker_is_still_a_mismatch(ruleset):
    facts = ProcessFacts(
        pid=2441,
        start_time=T,
        comm="pt_data_worker",
        exe="/var/lib/app/xm",
        cmdline=["/var/lib/app/xm"],
    )
    verdict, _ = _verdict(ruleset, facts)
    assert [e.rule_id for e in verdict.evidence] == ["masquerade-name-mismatch"]


# Facts ordinary programs show on their own every day, and the rules reading them (each tagged
# `generic` in rules/miner-rules.yaml): a busy thread, a long quiet session and one whose peer
# pushes work, a deleted config or binary, a renamed or preloaded process, a port some service
# shares with pools, huge pages, flat or growing GPU use, a program run from /tmp, rounding-mode
# switching (interval arithmetic, numeric tests).
COMMONLY_BENIGN = {
    "cpu-sustained-full",
    "net-quiet-session-cpu-spinning",
    "net-pool-session-shape",
    "config-deleted-after-start",
    "exe-deleted",
    "exe-in-temp-dir",
    "masquerade-name-mismatch",
    "ld-preload-set",
    "net-pool-port",
    "cpu-hugepages-randomx-size",
    "gpu-sustained-flat-load",
    "gpu-memory-growing",
    "cpu-fpu-rounding-switching",
}


def _generic_only_ruleset(ruleset, tmp_path):
    """The shipped generic rules (ids, tags, weights, thresholds as shipped), each matching when
    its id is a word of the command line: any combination of them can be made to match."""
    generic = [r for r in ruleset.rules if "generic" in r.tags and r.enabled]
    lines = ["version: 1", f"thresholds: {{suspicious: {ruleset.thresholds.suspicious}, "
             f"malicious: {ruleset.thresholds.malicious}}}", "rules:"]  # fmt: skip
    for rule in generic:
        lines += [
            f"  - id: {rule.id}",
            "    description: as shipped",
            f"    severity: {rule.severity}",
            f"    tags: [{', '.join(rule.tags)}]",
            f"    weight: {rule.weight}",
            f"    condition: {{signal: cmdline, matches: '(^| ){rule.id}( |$)'}}",
        ]
    path = tmp_path / "generic-only.yaml"
    path.write_text("\n".join(lines) + "\n")
    return generic, load_ruleset([path])


def test_generic_facts_alone_never_reach_suspicious_however_many(ruleset, tmp_path):
    """Every pair and triple of the shipped generic rules, and all of them at once, scored as a
    process that shows just those facts: held below suspicious, and the verdict says it was
    capped whenever the sum reached the threshold.  Three generic facts the night shift's busy
    workers show (a quiet session, a port a cache shares with pools, a thread that never
    sleeps: 20 + 15 + 10) are among them; this fails if they can convict again."""
    generic, only = _generic_only_ruleset(ruleset, tmp_path)
    assert COMMONLY_BENIGN <= {r.id for r in generic}, COMMONLY_BENIGN - {r.id for r in generic}
    combos = [c for n in (2, 3) for c in itertools.combinations(generic, n)] + [tuple(generic)]
    capped = 0
    for combo in combos:
        facts = ProcessFacts(pid=2442, start_time=T, comm="worker", exe="/usr/bin/worker",
                             cmdline=["worker", *(r.id for r in combo)])  # fmt: skip
        verdict, _ = _verdict(only, facts)
        assert {e.rule_id for e in verdict.evidence} == {r.id for r in combo}
        assert verdict.verdict == "clean", verdict.explain()
        total = sum(r.weight for r in combo)
        if total >= only.thresholds.suspicious:
            capped += 1
            assert verdict.score == only.thresholds.suspicious - 1 and verdict.cap.uncapped == min(
                100, total
            )
        else:
            assert verdict.cap is None and verdict.score == total
    assert capped > 100  # the cap, not the weights, is what keeps most of these clean
    night_shift = ("net-quiet-session-cpu-spinning", "net-pool-port", "cpu-sustained-full")
    weights = {r.id: r.weight for r in generic}
    assert sum(weights[name] for name in night_shift) >= ruleset.thresholds.suspicious
    # switching rounding modes without RandomX's pattern adds nothing to anything
    assert weights["cpu-fpu-rounding-switching"] == 0
