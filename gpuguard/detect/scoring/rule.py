"""The one scoring rule: evidence to a 0-100 score, a score to a verdict and to a severity.

Every score in gpuguard comes from :func:`score_of` (rule verdicts, guard policies) or is a host
rule's own, and every verdict and severity from :func:`verdict_for` and :func:`severity_for`;
tests/test_scoring_rule.py fails when a second copy appears.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from gpuguard.detect.ruleset.model import Thresholds

SCORE_RANGE = (0, 100)
# The severity a score carries in every output (ECS, OCSF, CEF, the table): the lowest score of each.
SEVERITY_BANDS = ((90, "critical"), (70, "high"), (40, "medium"), (1, "low"), (0, "informational"))


class Weighed(Protocol):
    weight: int


def score_of(evidence: Iterable[Weighed]) -> int:
    """The sum of the evidence's weights, held within 0-100 (a negative weight is benign evidence)."""
    low, high = SCORE_RANGE
    return max(low, min(high, sum(e.weight for e in evidence)))


def verdict_for(score: float, thresholds: Thresholds) -> str:
    """``malicious`` at or above its threshold, else ``suspicious`` at or above its, else ``clean``."""
    return _band(
        score, ((thresholds.malicious, "malicious"), (thresholds.suspicious, "suspicious")), "clean"
    )


def severity_for(score: float) -> str:
    """0-100 score -> "informational" | "low" | "medium" | "high" | "critical"."""
    return _band(score, SEVERITY_BANDS, "informational")


def _band(score: float, bands: tuple[tuple[float, str], ...], below: str) -> str:
    """The name of the first band (highest floor first) whose floor ``score`` reaches."""
    for floor, name in bands:
        if score >= floor:
            return name
    return below
