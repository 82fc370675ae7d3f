"""The generic cap: evidence from rules tagged ``generic`` alone never reaches ``suspicious``.

Why, and what counts as generic: docs/rules.md, "A verdict needs a specific fact".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gpuguard.detect.ruleset.model import Rule, RuleSet, Thresholds

GENERIC_TAG = "generic"


@dataclass(frozen=True, slots=True)
class ScoreCap:
    """A score held below ``suspicious``: the sum it had, the limit and why."""

    uncapped: int
    limit: int
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"uncapped_score": self.uncapped, "limit": self.limit, "reason": self.reason}


def is_specific(tags: Iterable[str], weight: int) -> bool:
    """Whether a matched rule with ``tags`` and ``weight`` lifts the cap (adds weight, not generic)."""
    return weight > 0 and GENERIC_TAG not in tags


def generic_cap(
    matched: Iterable[tuple[str, tuple[str, ...], int]], score: int, thresholds: Thresholds
) -> tuple[int, ScoreCap | None]:
    """``score`` and no cap, or the limit (one below ``suspicious``) and why, when only generic
    rules added weight; ``matched``: (rule id, tags, weight) of each matched rule."""
    matched = list(matched)
    limit = thresholds.suspicious - 1
    if score <= limit or any(is_specific(tags, weight) for _, tags, weight in matched):
        return score, None
    named = ", ".join(rule_id for rule_id, _, weight in matched if weight > 0)
    reason = f"generic evidence only ({named}): no rule with a specific fact matched"
    return limit, ScoreCap(score, limit, reason)


def escapes_the_cap(ruleset: RuleSet, shipped: RuleSet) -> list[tuple[Rule, str]]:
    """The rules a site file added or changed that let generic facts reach ``suspicious``: not
    tagged ``generic``, yet reading only signals the generic rules read, and heavy enough with
    those rules to cross the threshold; each with a line saying so (``rules validate`` warns)."""
    before = {rule.id: rule for rule in shipped.rules + shipped.disabled}
    generic = sorted(
        (r for r in ruleset.rules if GENERIC_TAG in r.tags and r.weight > 0),
        key=lambda r: (-r.weight, r.id),
    )
    generic_signals = {name for rule in generic for name in rule.signals}
    threshold = ruleset.thresholds.suspicious
    found = []
    for rule in ruleset.rules:
        was = before.get(rule.id)
        if was is not None and (was.tags, was.weight, was.signals) == (
            rule.tags,
            rule.weight,
            rule.signals,
        ):
            continue  # as shipped
        if not is_specific(rule.tags, rule.weight) or not set(rule.signals) <= generic_signals:
            continue
        total, partners = rule.weight, []
        for other in generic:
            if total >= threshold:
                break
            total += other.weight
            partners.append(f"{other.id} {other.weight:+d}")
        if total < threshold:
            continue
        changed = "" if was is None else "as a later file changed it, "
        found.append(
            (
                rule,
                f"{changed}not tagged {GENERIC_TAG} but reads only facts generic rules read "
                f"({', '.join(rule.signals)}): with {', '.join(partners)} it reaches "
                f"{total} >= suspicious {threshold} and no specific fact is needed",
            )
        )
    return found
