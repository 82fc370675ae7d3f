"""Rule by rule: which of a verdict's rules may act, what each would have enforce do, and why not."""

from __future__ import annotations

import pytest

from gpuguard.agent.counters import AgentCounters
from gpuguard.correlate.state import ProcessKey, ProcessState
from gpuguard.detect.scoring.score import Evidence, Verdict
from gpuguard.errors import GpuguardError
from gpuguard.respond import Responder, parse_response_settings


def _verdict(*rules: tuple[str, str, int], verdict: str = "malicious", allowlisted=False):
    return Verdict(
        ProcessKey(4242, 1.0),
        4242,
        "xmrig",
        "/tmp/xmrig",
        90,
        verdict,
        [Evidence(r, "s", "d", w, "high", maturity=m) for r, m, w in rules],
        allowlisted=allowlisted,
        action="alert",
    )


def _responder(section: dict | None, mode: str = "enforce") -> Responder:
    settings = parse_response_settings(
        {"actions": {"malicious": ["kill"]}, **(section or {})}, source="agent.yaml"
    )
    return Responder(settings, mode=mode, dry_run=True)


def test_stable_rules_act_by_default_and_lower_tiers_only_say_what_they_would_do():
    responder = _responder(None)
    both = responder.intent(_verdict(("a", "stable", 40), ("b", "incubating", 40)))
    assert both.steps == ("alert", "kill") and both.enforcing == ("a",)
    assert both.to_json() == {
        "would_act": ["kill"],
        "acts": ["kill"],
        "rules": {
            "a": "enforce",
            "b": "monitor: incubating is below response.act_maturity stable",
        },
    }
    only_b = responder.intent(_verdict(("b", "incubating", 80)))
    assert only_b.steps == ("alert",) and only_b.acting == ("kill",)
    assert only_b.to_json()["why_not"] == (
        "no matched rule is in enforce mode (b: incubating is below response.act_maturity stable)"
    )
    lower = _responder({"act_maturity": "incubating"}).intent(_verdict(("b", "incubating", 80)))
    assert lower.steps == ("alert", "kill")


def test_act_rules_name_the_only_rules_that_act():
    responder = _responder({"act_rules": ["miner-config-keys", "cpu-randomx-miner"]})
    listed = responder.intent(_verdict(("cpu-randomx-miner", "stable", 45), ("x", "stable", 40)))
    assert listed.steps == ("alert", "kill")
    assert listed.modes["x"] == "monitor: not in response.act_rules"
    other = responder.intent(_verdict(("x", "stable", 80)))
    assert other.steps == ("alert",) and other.why_not.endswith("x: not in response.act_rules)")
    # benign evidence (weight 0 or less) never makes a verdict act
    benign = responder.intent(_verdict(("x", "stable", 80), ("miner-config-keys", "stable", 0)))
    assert benign.steps == ("alert",) and "miner-config-keys" not in benign.per_rule


def test_rule_actions_of_a_monitor_mode_rule_are_only_what_it_would_do():
    responder = _responder(
        {"act_rules": ["a"], "rule_actions": {"b": ["quarantine"], "a": ["suspend"]}}
    )
    intent = responder.intent(_verdict(("a", "stable", 40), ("b", "stable", 40)))
    assert intent.planned == ("alert", "quarantine", "suspend", "kill")
    assert intent.steps == ("alert", "suspend", "kill")  # b's quarantine is held back
    assert intent.per_rule == {"a": ("suspend", "kill"), "b": ("quarantine", "kill")}


def test_monitor_mode_says_what_enforce_would_do_through_each_rule():
    intent = _responder(None, mode="monitor").intent(_verdict(("a", "stable", 80)))
    assert intent.steps == ("alert",)
    assert intent.to_json() == {
        "would_act": ["kill"],
        "acts": [],
        "rules": {"a": "monitor: the agent runs in monitor mode"},
        "why_not": "monitor mode: enforce would act through a",
    }
    outcome = _responder(None, mode="monitor").respond(
        _verdict(("a", "stable", 80)), ProcessState(ProcessKey(4242, 1.0)), 1.0
    )[0]
    assert outcome.detail["response"]["would_act"] == ["kill"]


def test_allowlisted_and_guard_policy_verdicts():
    responder = _responder(None)
    assert responder.intent(_verdict(("a", "stable", 80), allowlisted=True)).to_json() is None
    guard = Verdict(
        ProcessKey(1, 1.0),
        1,
        "x",
        "/x",
        0,
        "malicious",
        [Evidence("guard.gpu0", "guard_policy", "d", 0, "high", ("guard-policy",))],
    )
    assert responder.intent(guard).steps == ("kill",)  # a policy's verdict is its own
    assert _responder({"act_rules": ["x"]}).intent(guard).steps == ()


def test_counters_split_what_was_held_back_from_what_was_done():
    counters = AgentCounters()
    intent = _responder({"act_rules": ["a"]}).intent(
        _verdict(("a", "stable", 40), ("b", "stable", 40))
    )
    counters.count_intent(intent.per_rule, {"kill"}, intent.enforcing, "xmrig(4242)")
    counters.count_intent(intent.per_rule, set(), intent.enforcing, "xmrig(4243)")  # refused
    snapshot = counters.snapshot()
    assert snapshot["rule_acted"] == {"a/kill": 1}
    assert snapshot["rule_would_act"] == {"b/kill": 2, "a/kill": 1}
    assert list(counters.rule_processes["b"]) == ["xmrig(4242)", "xmrig(4243)"]


def test_bad_settings_are_one_line_with_the_position():
    with pytest.raises(GpuguardError) as caught:
        parse_response_settings({"act_maturity": "beta"}, source="agent.yaml")
    assert "act_maturity" in caught.value.one_line() and "stable" in caught.value.one_line()
