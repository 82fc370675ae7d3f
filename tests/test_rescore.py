"""The rescore policy loses no detection: GPU samples and age crossings rescore within a stated delay.

A GPU sample does not rescore a process by itself; the engine re-evaluates the
rules' tests of GPU-window signals at most every GPU_CHECK_EVERY_S per process
and rescores only when one answers differently.  Ages are looked at every
AGE_CHECK_EVERY_S and a process is rescored when its age crosses a number some
rule compares it with.  These tests replay the real H100 traces (and the
synthetic variants, see tests/traces/cases/*/expected.yaml) the way the agent
runs (correlate every item, score once a second of event time) and compare the
engine's verdict at every scoring with an oracle: a from-scratch evaluation
after every GPU sample.  The engine's verdict must always be one the oracle
gave within the last GPU_CHECK_EVERY_S + 1 s: a crossing that is never
rescored, or rescored late, fails them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import gpuguard.detect.scoring.engine as engine_module
from gpuguard.correlate.correlator import Correlator
from gpuguard.correlate.state import ProcessKey, ProcessState
from gpuguard.detect.ruleset.load import load_ruleset
from gpuguard.detect.ruleset.shipped import shipped_rules_file
from gpuguard.detect.scoring.engine import DetectionEngine
from gpuguard.detect.scoring.score import score_process
from gpuguard.detect.signals import memo
from gpuguard.detect.signals.reader import SignalReader
from gpuguard.detect.signals.rescore import AGE_CHECK_EVERY_S, GPU_CHECK_EVERY_S, GPU_SAMPLE_SIGNALS
from gpuguard.detect.signals.table import SIGNALS
from gpuguard.events.gpu_snapshot import DeviceSample, GpuSnapshot, ProcessGpuUsage
from gpuguard.events.process_facts import ProcessFacts
from gpuguard.events.wire import iter_recording
from tests.support.memo import set_aside

CASES = Path(__file__).resolve().parent / "traces" / "cases"
SCORE_EVERY_S = 1.0  # as the agent scores
DELAY_S = GPU_CHECK_EVERY_S + SCORE_EVERY_S  # the bound this policy promises
T = 1_795_305_600.0  # 2026-11-22 00:00 UTC
GIB = 1 << 30


@pytest.fixture(scope="module")
def ruleset():
    return load_ruleset([shipped_rules_file()])


def _fresh(state: ProcessState, ruleset, now: float) -> tuple:
    with set_aside(state):
        v = score_process(state, ruleset, now)
    return v.verdict, v.score, tuple(sorted(e.rule_id for e in v.evidence))


def _said(state: ProcessState) -> tuple:
    v = state.verdict
    return v.verdict, v.score, tuple(sorted(e.rule_id for e in v.evidence))


def replay_against_oracle(capture: Path, ruleset) -> tuple[dict, dict]:
    """Per process: the oracle's answers [(time, answer)] after every GPU sample, and the engine's
    [(time, answer)] at every scoring."""
    correlator = Correlator(facts_provider=None)
    engine = DetectionEngine(correlator, ruleset)
    oracle: dict[ProcessKey, list] = {}
    said: dict[ProcessKey, list] = {}
    next_score = None
    for item in iter_recording(capture):
        correlator.feed(item)
        now = item.start_time if isinstance(item, ProcessFacts) else item.time
        if isinstance(item, GpuSnapshot):
            for usage in item.processes:
                state = correlator.state_of(usage.pid)
                if state is not None:
                    oracle.setdefault(state.key, []).append((now, _fresh(state, ruleset, now)))
        if next_score is None or now >= next_score:
            engine.score(now)
            next_score = now + SCORE_EVERY_S
            for state in correlator.states():
                if state.key in oracle:
                    said.setdefault(state.key, []).append((now, _said(state)))
    return oracle, said


def late_verdicts(oracle: dict, said: dict, delay_s: float) -> list[str]:
    """Every scoring at which the engine's verdict is none the oracle gave in the last ``delay_s``."""
    late = []
    for key, answers in said.items():
        truth = oracle[key]
        for now, answer in answers:
            # What the oracle said in the last delay_s (or, with no sample then, its latest answer).
            allowed = [a for t, a in truth if now - delay_s <= t <= now] or [
                a for t, a in truth if t <= now
            ][-1:]
            if allowed and answer not in allowed:
                late.append(
                    f"pid {key.pid} at +{now - truth[0][0]:.0f} s: engine {answer}, oracle {allowed}"
                )
    return late


TRACE_CASES = sorted(p.name for p in CASES.iterdir() if (p / "capture.ggrec").is_file())


@pytest.mark.parametrize("case", TRACE_CASES)
def test_verdicts_follow_the_gpu_behaviour_within_the_stated_delay(case, ruleset):
    oracle, said = replay_against_oracle(CASES / case / "capture.ggrec", ruleset)
    assert said, "no GPU process was scored"
    assert late_verdicts(oracle, said, DELAY_S) == []


def test_hashing_loop_reaches_suspicious_on_behaviour_alone_within_the_delay(ruleset):
    oracle, said = replay_against_oracle(
        CASES / "h100_hashing_loop_blanked" / "capture.ggrec", ruleset
    )
    (key,) = said
    first_truth = next(t for t, (verdict, _, _) in oracle[key] if verdict != "clean")
    first_said = next(t for t, (verdict, _, _) in said[key] if verdict != "clean")
    # The window reaches 60 s about a minute in: a threshold a GPU sample crosses, not the first sample.
    assert first_truth - oracle[key][0][0] >= 55
    assert 0 <= first_said - first_truth <= DELAY_S
    verdict, score, rules = said[key][-1][1]
    assert verdict == "suspicious" and score >= 40 and "gpu-hashing-shape" in rules
    assert all(rule.startswith("gpu-") for rule in rules)  # nothing but behaviour


@pytest.mark.parametrize(
    "case", ["h100_cnn_training", "h100_inference_server", "synthetic_burn_in"]
)
def test_benign_traces_stay_clean_at_every_scoring(case, ruleset):
    _, said = replay_against_oracle(CASES / case / "capture.ggrec", ruleset)
    assert said and all(answer[0] == "clean" for answers in said.values() for _, answer in answers)


def test_the_oracle_comparison_fails_when_gpu_samples_are_never_looked_at(ruleset, monkeypatch):
    """The check above can fail: with the GPU look postponed for ever, the hashing loop's
    crossing is never rescored and the comparison reports it."""
    monkeypatch.setattr(engine_module, "GPU_CHECK_EVERY_S", 1e9)
    oracle, said = replay_against_oracle(
        CASES / "h100_hashing_loop_blanked" / "capture.ggrec", ruleset
    )
    (key,) = said
    assert said[key][-1][1][0] == "clean"  # the verdict never came
    assert late_verdicts(oracle, said, DELAY_S)


def test_a_gpu_sample_that_changes_no_answer_does_not_rescore(ruleset):
    c = Correlator(facts_provider=None)
    engine = DetectionEngine(c, ruleset)
    c.feed(
        ProcessFacts(
            pid=50,
            start_time=T,
            comm="python3",
            exe="/usr/bin/python3.11",
            cmdline=["python3", "serve.py"],
            uid=1000,
            username="bob",
        )
    )

    def sample(t: float, sm: float) -> GpuSnapshot:
        return GpuSnapshot(
            time=t,
            source="test",
            devices=[DeviceSample("nvidia", 0, memory_total=80 * GIB)],
            processes=[
                ProcessGpuUsage(
                    pid=50, vendor="nvidia", device_index=0, sm_util=sm, used_memory=2 * GIB
                )
            ],
        )

    c.feed(sample(T, 30.0))
    assert len(engine.score(T)) == 1
    rescored = []
    for i in range(1, 120):
        c.feed(sample(T + i, 30.0 + 5 * (i % 3)))  # varying (SM 30-40 %): no rule comes near
        rescored += [i for _ in engine.score(T + i)]
    # Only when the window crossed a length a rule compares with (10 s, then 60 s, with the
    # allocation's 60 s): 2 rescorings instead of one per sample (119) or per 10 s (11).
    assert len(rescored) == 2
    assert 10 <= rescored[0] <= 10 + DELAY_S and 60 <= rescored[1] <= 60 + DELAY_S
    # The look itself happened every GPU_CHECK_EVERY_S (not skipped for ever).
    assert T + 119 - memo.entries_of(c.state_of(50))["gpu-answers"][1][1] < GPU_CHECK_EVERY_S


def test_a_gpu_sample_changes_only_gpu_sample_signals():
    state = ProcessState(ProcessKey(60, T), first_seen=T, last_seen=T)
    state.set_facts(
        ProcessFacts(pid=60, start_time=T, comm="python3", exe="/usr/bin/python3.11", uid=0)
    )
    device = DeviceSample(
        "nvidia", 0, mem_util=1.0, power_w=390.0, pcie_tx_kbs=1500, pcie_rx_kbs=1400
    )
    for i in range(30):
        state.add_gpu_sample(T + i, 99.0, GIB, 0.0, device, False)
    state.gpu_memory_total = 80 * GIB

    def values() -> dict:
        reader = SignalReader(state, T + 100)
        return {name: reader[name] for name, s in SIGNALS.items() if s.parameter is None}

    before = values()
    state.add_gpu_sample(T + 30, 40.0, 3 * GIB, 50.0, None, True)
    changed = {name for name, value in values().items() if value != before[name]}
    assert changed and changed <= GPU_SAMPLE_SIGNALS, sorted(changed - GPU_SAMPLE_SIGNALS)


AGE_RULES = """\
version: 1
rules:
  - id: old
    description: older than ten minutes
    severity: low
    weight: 50
    condition: {signal: age_s, gte: 600}
"""


def test_age_rules_rescore_only_the_processes_that_cross(tmp_path):
    path = tmp_path / "age.yaml"
    path.write_text(AGE_RULES)
    ruleset = load_ruleset([path])
    assert ruleset.age_crossings == ((600.0, True),) and ruleset.time_rescore_period_s is None
    c = Correlator(facts_provider=None)
    engine = DetectionEngine(c, ruleset)
    for pid in range(100, 200):  # started every 30 s
        c.feed(
            ProcessFacts(
                pid=pid, start_time=T + 30 * (pid - 100), comm="sleep", exe="/usr/bin/sleep", uid=0
            )
        )
    now = T + 30 * 99
    engine.score(now)
    rescored: list[tuple[float, int]] = []
    for step in range(1, 4 * 60 + 1):
        t = now + step
        rescored += [(t, v.pid) for v in engine.score(t)]
    # In 4 minutes, exactly the 8 processes that turned 600 s old were rescored, once each,
    # within AGE_CHECK_EVERY_S of that moment, and matched.
    crossed = {pid for pid in range(100, 200) if now < T + 30 * (pid - 100) + 600 <= now + 240}
    assert sorted(pid for _, pid in rescored) == sorted(crossed) and len(crossed) == 8
    for t, pid in rescored:
        turned = T + 30 * (pid - 100) + 600
        assert 0 <= t - turned <= AGE_CHECK_EVERY_S + SCORE_EVERY_S
        assert c.state_of(pid).verdict.score == 50


def test_age_tests_other_than_comparisons_rescore_everything_once_a_minute(tmp_path):
    path = tmp_path / "age.yaml"
    path.write_text(AGE_RULES.replace("gte: 600", "in: [600, 601]"))
    ruleset = load_ruleset([path])
    assert ruleset.age_crossings is None and ruleset.time_rescore_period_s == 60.0


def test_an_age_verdict_follows_a_clock_set_back(tmp_path):
    path = tmp_path / "age.yaml"
    path.write_text(AGE_RULES)
    c = Correlator(facts_provider=None)
    engine = DetectionEngine(c, load_ruleset([path]))
    c.feed(ProcessFacts(pid=70, start_time=T, comm="sleep", exe="/usr/bin/sleep", uid=0))
    engine.score(T + 1)
    assert [v.score for v in engine.score(T + 700)] == [50]
    assert [v.score for v in engine.score(T + 5)] == [0]  # before its 600th second again
