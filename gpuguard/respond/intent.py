"""Rule by rule: which of a verdict's rules may act, what each would have enforce do, and why not.

A verdict is acted on only through its rules in enforce mode: a matched rule (weight above 0)
whose tier is at least ``response.act_maturity`` and, when ``response.act_rules`` is set, is
listed there, in an agent in enforce mode.  The steps that act are the verdict's (its
``response.actions`` entry and the rules file's action) plus the ``rule_actions`` of the rules
in enforce mode; the other rules' steps are what enforce *would* have done.  The record says
so (:meth:`Intent.to_json`), and the agent counts both by rule
(``gpuguard_rule_would_act_total``, ``gpuguard_rule_acted_total``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuguard.detect.ruleset.model import at_least

MONITOR = "monitor"
ENFORCE = "enforce"


@dataclass(frozen=True, slots=True)
class Intent:
    """What a verdict plans, rule by rule, and what runs now (``steps``)."""

    planned: tuple[str, ...]  # every step any of its rules plans, in the order steps run
    acting: tuple[str, ...]  # the planned steps that act (what enforce mode would do)
    per_rule: Mapping[str, tuple[str, ...]]  # matched rule -> the acting steps its match plans
    modes: Mapping[str, str]  # matched rule -> "enforce", or "monitor: why"
    steps: tuple[str, ...]  # the steps to run now (acting ones only through enforce-mode rules)
    why_not: str | None = None  # why acting steps were planned and none runs

    @property
    def enforcing(self) -> tuple[str, ...]:
        return tuple(rule for rule, mode in self.modes.items() if mode == ENFORCE)

    def to_json(self) -> dict[str, Any] | None:
        """The record's ``response``: None when nothing would act."""
        if not self.acting:
            return None
        runs = [s for s in self.steps if s in self.acting]
        out: dict[str, Any] = {
            "would_act": list(self.acting),
            "acts": runs,
            "rules": {rule: self.modes[rule] for rule in self.per_rule},
        }
        if self.why_not:
            out["why_not"] = self.why_not
        return out


def rule_mode(
    rule_id: str, maturity: str, agent_mode: str, act_maturity: str, act_rules: tuple[str, ...]
) -> str:
    """``enforce``, or ``monitor: <why>`` for one matched rule."""
    if agent_mode != ENFORCE:
        return f"{MONITOR}: the agent runs in monitor mode"
    if not at_least(maturity, act_maturity):
        return f"{MONITOR}: {maturity} is below response.act_maturity {act_maturity}"
    if act_rules and rule_id not in act_rules:
        return f"{MONITOR}: not in response.act_rules"
    return ENFORCE


def intent_of(
    verdict: Any,
    settings: Any,
    order: tuple[str, ...],
    acts: Mapping[str, bool],
    agent_mode: str,
) -> Intent:
    """The :class:`Intent` of ``verdict`` under ``settings`` (``response:``); ``order``: the
    actions in the order they run, ``acts``: whether each acts."""
    base = set(settings.actions.get(verdict.verdict, ()))
    if verdict.action in acts:
        base.add(verdict.action)
    rules = {}  # matched rules that weigh toward the verdict, with their tiers
    for evidence in verdict.evidence:
        if evidence.weight > 0 or "guard-policy" in evidence.tags:  # a policy's verdict is its own
            rules.setdefault(evidence.rule_id, getattr(evidence, "maturity", "stable"))
    everything = set(base)
    per_rule: dict[str, tuple[str, ...]] = {}
    modes: dict[str, str] = {}
    for rule_id, maturity in rules.items():
        own = base | set(settings.rule_actions.get(rule_id, ()))
        everything |= own
        per_rule[rule_id] = tuple(s for s in order if s in own and acts[s])
        modes[rule_id] = rule_mode(
            rule_id, maturity, agent_mode, settings.act_maturity, settings.act_rules
        )
    for evidence in verdict.evidence:  # benign evidence (weight <= 0) still names its extra steps
        everything |= set(settings.rule_actions.get(evidence.rule_id, ()))
    if verdict.allowlisted:  # at most alerted on: no step that acts
        everything = {s for s in everything if not acts[s]}
        per_rule = {r: () for r in per_rule}
    planned = tuple(s for s in order if s in everything)
    acting = tuple(s for s in planned if acts[s])
    enforcing = [r for r, mode in modes.items() if mode == ENFORCE]
    run = set(base)
    for rule_id in enforcing:
        run |= set(settings.rule_actions.get(rule_id, ()))
    steps = tuple(s for s in planned if not acts[s] or (enforcing and s in run))
    why_not = None
    if acting and not any(acts[s] for s in steps):
        if agent_mode != ENFORCE:
            why_not = "monitor mode: enforce would act through " + ", ".join(per_rule)
        elif not per_rule:
            why_not = "no matched rule weighs toward the verdict"
        else:
            why_not = (
                "no matched rule is in enforce mode ("
                + "; ".join(f"{rule}: {modes[rule].split(': ', 1)[1]}" for rule in per_rule)
                + ")"
            )
    return Intent(planned, acting, per_rule, modes, steps, why_not)
