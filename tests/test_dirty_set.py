"""Scoring visits only the processes that changed: the correlator keeps the set of dirty states
(ProcessState.dirty keeps it), so a pass costs the changes, not every tracked process."""

from __future__ import annotations

import gpuguard.detect.scoring.engine as engine_module
from gpuguard.correlate.correlator import Correlator
from gpuguard.detect.ruleset.load import load_ruleset
from gpuguard.detect.ruleset.shipped import shipped_rules_file
from gpuguard.detect.scoring.engine import DetectionEngine
from gpuguard.events.model import Exit
from gpuguard.events.process_facts import ProcessFacts

T = 1_795_305_600.0
MINER = ["/tmp/xmrig", "-o", "stratum+tcp://pool.example.invalid:3333", "--donate-level", "1"]


def facts(pid: int, cmdline: list[str]) -> ProcessFacts:
    return ProcessFacts(
        pid=pid, start_time=T + pid, ppid=1, comm=cmdline[0].rsplit("/", 1)[-1],
        exe=cmdline[0], cmdline=cmdline, uid=1000,
    )  # fmt: skip


def test_a_pass_scores_only_the_changed_processes(monkeypatch):
    correlator = Correlator(facts_provider=None)
    engine = DetectionEngine(correlator, load_ruleset([shipped_rules_file()]))
    for pid in range(100, 400):
        correlator.feed(facts(pid, ["/usr/bin/sleep", "60"]))
    assert len(correlator.dirty) == 300
    assert len(engine.score(T + 500)) == 300
    assert correlator.dirty == set()

    scored = []
    real = engine_module.score_process
    monkeypatch.setattr(
        engine_module, "score_process", lambda s, *a: scored.append(s.pid) or real(s, *a)
    )
    assert engine.score(T + 501) == []
    assert scored == []  # nothing changed: nothing visited

    correlator.feed(facts(250, MINER))  # the same process (same start) execs a miner
    (state,) = correlator.dirty
    assert state.pid == 250 and state.dirty
    (verdict,) = engine.score(T + 502)
    assert scored == [250]
    assert verdict.verdict in ("suspicious", "malicious")
    assert not state.dirty and correlator.dirty == set()


def test_a_forgotten_process_leaves_the_dirty_set():
    correlator = Correlator(facts_provider=None, exit_grace_s=1.0)
    DetectionEngine(correlator, load_ruleset([shipped_rules_file()]))
    correlator.feed(facts(7, ["/usr/bin/sleep", "60"]))
    state = correlator.state_of(7)
    correlator.feed(Exit(time=T + 10, pid=7))
    assert correlator.dirty == {state}
    correlator.expire(T + 100)
    assert correlator.get(state.key) is None
    assert correlator.dirty == set()
    state.dirty = True  # a stale reference marked later is not tracked again
    assert correlator.dirty == set()
