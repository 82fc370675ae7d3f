"""The agent's stages: enrich reads before correlation, the engine's result is kept by correlation.

Real processes (a ``sleep`` with a miner config beside it) and the shipped rules; no agent
thread: the stages are driven the way the loop drives them.
"""

from __future__ import annotations

import subprocess
import time
import types

import pytest

from gpuguard.agent.config_schema import AgentConfig
from gpuguard.agent.stages.s2_enrich import EnrichStage
from gpuguard.correlate.correlator import Correlator
from gpuguard.detect.ruleset.load import load_ruleset
from gpuguard.detect.ruleset.shipped import shipped_rules_file
from gpuguard.detect.scoring.engine import DetectionEngine
from gpuguard.events.model import Connect, Exit


@pytest.fixture
def sleeper(tmp_path):
    (tmp_path / "config.json").write_text('{"pools": [{"url": "stratum+tcp://pool.example:3333"}]}')
    proc = subprocess.Popen(["sleep", "60"], cwd=tmp_path)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def ruleset():
    return load_ruleset([shipped_rules_file()])


def _enrich_and_correlator(ruleset):
    ctx = types.SimpleNamespace(
        proc_root="/proc", lifecycle=lambda *a, **k: None, config=AgentConfig()
    )
    enrich = EnrichStage(ctx, ruleset)  # type: ignore[arg-type]
    correlator = Correlator(facts_provider=enrich.facts_of, on_new_facts=enrich.on_new_facts)
    return enrich, correlator


def test_enrich_reads_a_new_process_before_the_correlator_meets_it(sleeper, ruleset):
    enrich, correlator = _enrich_and_correlator(ruleset)
    now = time.time()
    items = [
        Connect(time=now, pid=sleeper.pid, comm="sleep", address="127.0.0.1", port=3333),
        Connect(time=now, pid=sleeper.pid, comm="sleep", address="127.0.0.1", port=3334),
    ]
    with enrich.batch(items, correlator):
        # read (and its image scanned) once, before any item is correlated
        assert enrich.counts["facts_read"] == 1 and correlator.state_of(sleeper.pid) is None
        assert enrich.counts["yara_scans"] == (1 if ruleset.yara_files else 0)
        for item in items:
            correlator.feed(item)
    state = correlator.state_of(sleeper.pid)
    assert state is not None and not state.provisional
    assert "config.json" in state.facts.config_files  # attached by enrich, not by correlation
    assert enrich.counts["yara_scans"] == (1 if ruleset.yara_files else 0)  # not scanned again
    assert (enrich.counts["facts_unused"], enrich.counts["late_reads"]) == (0, 0)
    # a known process is not read again; an item fed outside a batch still gets its facts
    with enrich.batch(items, correlator):
        correlator.feed(items[0])
    assert enrich.counts["facts_read"] == 1
    correlator.feed(Exit(time=now + 1, pid=sleeper.pid))
    correlator.feed(items[0])  # the same pid, now unknown: read there and then
    assert enrich.counts["late_reads"] == 1


def test_the_engine_returns_verdicts_and_the_correlator_keeps_them(sleeper, ruleset):
    enrich, correlator = _enrich_and_correlator(ruleset)
    engine = DetectionEngine(correlator, ruleset)
    now = time.time()
    item = Connect(time=now, pid=sleeper.pid, comm="sleep", address="127.0.0.1", port=3333)
    with enrich.batch([item], correlator):
        correlator.feed(item)
    state = correlator.state_of(sleeper.pid)
    assert state.dirty and state.verdict is None
    scoring = engine.evaluate(now)
    # nothing written into the state: the result says what to keep
    assert state.dirty and state.verdict is None
    assert [v.pid for v in scoring.verdicts] == [sleeper.pid] and state in scoring.marked
    correlator.apply_scoring(scoring)
    assert not state.dirty and state.verdict is scoring.verdicts[0]
    assert engine.evaluate(now).verdicts == []  # nothing changed since
