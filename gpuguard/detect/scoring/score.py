"""Scoring: matched rules become evidence, evidence becomes a 0-100 score and a verdict.

The score is the sum of the weights of the matched rules, clamped to 0-100
(negative weights record benign evidence; :mod:`.rule`, the one scoring rule), and held below ``suspicious`` when
only rules tagged ``generic`` added weight (:mod:`.cap`).  A plain sum keeps every finding
explainable ("+40 stratum URL"): the reader can add the numbers in the line.
The verdict compares the score with the rule set's thresholds
(``malicious`` >= its threshold, else ``suspicious`` >= its threshold, else
``clean``).  An allowlisted process is ``clean`` with ``allowlisted=True``;
its evidence and score are kept for audit.  The same state and rules always
give the same verdict: evidence is ordered by weight, then rule id.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuguard.correlate.state import ProcessKey, ProcessState
from gpuguard.detect.ruleset.load import Rule, RuleSet
from gpuguard.detect.scoring.cap import ScoreCap, generic_cap
from gpuguard.detect.scoring.rule import score_of, verdict_for
from gpuguard.detect.signals.memo import keep, kept
from gpuguard.detect.signals.reader import SignalReader
from gpuguard.escape import escape_text


@dataclass(slots=True)
class Evidence:
    """One matched rule: what it saw and what it weighs (the one evidence type: verdicts,
    findings and every output carry it)."""

    rule_id: str
    signal: str  # the signals the rule's condition reads, comma-separated
    detail: str  # what matched, e.g. "connect_ports=3333 (in_list pool_ports)"
    weight: int
    severity: str
    tags: tuple[str, ...] = ()
    description: str = ""
    categories: tuple[str, ...] = ()  # the rule's (Rule.categories): where the finding is filed
    maturity: str = "stable"  # the rule's tier (respond.intent: which tiers may act)

    def to_json(self) -> dict[str, Any]:
        return {
            "rule_id": self.rule_id,
            "description": self.description,
            "signal": self.signal,
            "detail": self.detail,
            "weight": self.weight,
            "severity": self.severity,
            "tags": list(self.tags),
        }


@dataclass(slots=True)
class Verdict:
    key: ProcessKey
    pid: int
    comm: str
    exe: str
    score: int
    verdict: str  # "clean" | "suspicious" | "malicious"
    evidence: list[Evidence] = field(default_factory=list)
    allowlisted: bool = False
    action: str = "none"
    allowlist_entry: str | None = None
    exe_deleted: bool = False
    time: float = 0.0
    cap: ScoreCap | None = None  # the score was held below suspicious (generic evidence only)

    def explain(self) -> str:
        """One escaped line: who, score, verdict and each piece of evidence with its weight and rule."""
        where = escape_text(self.exe) if self.exe else "no executable"
        if self.exe_deleted:
            where += ", deleted"
        head = f"pid {self.pid} {escape_text(self.comm) or '?'} ({where}) score {self.score}"
        if self.cap is not None:
            head += f" (capped from {self.cap.uncapped}: generic evidence only)"
        head += f" {self.verdict}"
        if self.allowlisted:
            head += f" (allowlisted by {escape_text(self.allowlist_entry)})"
        if not self.evidence:
            return head + ": no evidence"
        parts = [
            f"{escape_text(e.description)} ({e.weight:+d}, {e.rule_id})" for e in self.evidence
        ]
        return head + ": " + "; ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "start_time": self.key.start_time,
            "comm": self.comm,
            "exe": self.exe,
            "exe_deleted": self.exe_deleted,
            "score": self.score,
            "score_capped": self.cap is not None,
            "score_cap": self.cap.to_json() if self.cap is not None else None,
            "verdict": self.verdict,
            "allowlisted": self.allowlisted,
            "allowlist_entry": self.allowlist_entry,
            "action": self.action,
            "time": self.time,
            "evidence": [e.to_json() for e in self.evidence],
        }


def score_process(
    state: ProcessState,
    ruleset: RuleSet,
    now: float,
    reader: SignalReader | None = None,
    alike: dict[tuple, list[Evidence]] | None = None,
) -> Verdict:
    """Evaluate every enabled rule that can match ``state`` (``RuleSet.groups_for``) at ``now``;
    see the module docstring.

    ``reader``: the signals of ``state`` at ``now`` already read (the engine's GPU check).
    ``alike``: kept outcomes of the processes scored before in the same pass, by the values of
    their inputs (``RuleGroup.alike``): a process whose inputs equal an earlier one's gets its
    outcome without evaluating (the engine passes one per pass, so it holds nothing longer).

    A rule that reads only signals derived from the facts, endpoints and GPU
    devices is evaluated once and its outcome kept in detect's memo until
    one of those changes; rules reading GPU or CPU windows, counts, time, YARA
    or the parent's verdict are evaluated every time.
    """
    if reader is None:
        reader = SignalReader(state, now)
    entries = reader.memo
    evidence: list[Evidence] = []
    for cache_name, rules, same_as in ruleset.groups_for(state):
        if cache_name is None:
            evidence += _matched(rules, reader)
            continue
        outcome = kept(entries, state, cache_name)
        if outcome is None or outcome[0] is not ruleset:
            # not evaluated since the last change, or rules reloaded: the outcome of a process
            # whose inputs to these rules are equal, else evaluated
            key = same_as(state) if same_as is not None and alike is not None else None
            matched = alike.get(key) if key is not None else None
            if matched is None:
                matched = _matched(rules, reader)
                if key is not None:
                    alike[key] = matched
            outcome = keep(entries, state, cache_name, (ruleset, matched))
        evidence += outcome[1]
    evidence.sort(key=lambda e: (-e.weight, e.rule_id))
    score, cap = generic_cap(
        ((e.rule_id, e.tags, e.weight) for e in evidence), score_of(evidence), ruleset.thresholds
    )
    verdict = verdict_for(score, ruleset.thresholds)
    entry = ruleset.allowlist.match(state) if ruleset.allowlist.entries else None
    if entry is not None:
        verdict = "clean"
    facts = state.facts
    return Verdict(
        key=state.key,
        pid=state.key.pid,
        comm=state.comm,
        exe=state.exe,
        score=score,
        verdict=verdict,
        evidence=evidence,
        allowlisted=entry is not None,
        action=ruleset.actions.get(verdict, "none"),
        allowlist_entry=entry.id if entry is not None else None,
        exe_deleted=bool(facts and facts.exe_deleted),
        time=now,
        cap=cap,
    )


def _matched(rules: tuple[Rule, ...], reader: SignalReader) -> list[Evidence]:
    """Evidence of each of ``rules`` whose condition holds."""
    found = []
    for rule in rules:
        witnesses = rule.condition(reader)
        if witnesses is not None:
            found.append(
                Evidence(
                    rule.id,
                    ",".join(rule.signals),
                    "; ".join(witnesses),
                    rule.weight,
                    rule.severity,
                    rule.tags,
                    rule.description,
                    rule.categories,
                    rule.maturity,
                )
            )
    return found
