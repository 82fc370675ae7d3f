"""The OutputFormat record: one log and scan format's mappers, escaping and what `scan` offers.

Each format module (ecs, ocsf, cef) builds its own ``FORMAT``; :mod:`gpuguard.outputs.records`
lists them.  A new format is one module plus one entry in that list.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpuguard.events.agent_events import ActionOutcome, AgentLifecycle
from gpuguard.outputs.bounds import OutputLimits, fit_json, pick
from gpuguard.outputs.finding import Finding
from gpuguard.outputs.jsonl import dumps_line

AGENT_DATASET = "gpuguard.agent"
SCAN_DATASET = "gpuguard.scan"
LIFECYCLE_FAILURES = ("start-failed", "reload-failed", "fault")
LIFECYCLE_WARNINGS = ("drops", "degraded")


@dataclass(frozen=True, slots=True)
class Target:
    """Where records are written from: the host's ECS fields, its name and the dataset."""

    host: dict[str, Any]
    hostname: str
    dataset: str = AGENT_DATASET


# render(n): the record's document with at most n pieces of evidence (findings only).
Encode = Callable[[Callable[[int], Any], int, OutputLimits], str]


@dataclass(frozen=True, slots=True)
class OutputFormat:
    """One output format: how each record maps to a document, and how a document becomes a line."""

    name: str  # agent.yaml ``log.format``, ``agent --log-format``
    doc: str
    finding: Callable[[Finding, float, Target], Any]  # (finding, created, target)
    action: Callable[[ActionOutcome, Target], Any]
    lifecycle: Callable[[AgentLifecycle, Target], Any]
    encode: Encode  # escaping and the record budget: a document -> one bounded line
    mark_path: tuple[str, ...] = ()  # where a capped JSON document says what was cut
    scan_option: str | None = None  # ``scan --format`` name; None: scan does not offer it
    scan_help: str = ""  # what ``scan --help`` says of it
    scan_schema: dict[str, Any] = field(default_factory=dict)  # scan's ``scanner.schema``


def json_encoder(mark_path: tuple[str, ...], skeleton: tuple[str, ...]) -> Encode:
    """One JSON line: every field escaped and capped, shed down to ``skeleton`` as a last resort."""

    def encode(render: Callable[[int], Any], evidence: int, limits: OutputLimits) -> str:
        return fit_json(
            render, dumps_line, limits, mark_path, lambda doc: pick(doc, skeleton), evidence
        )

    return encode


def lifecycle_severity(record: AgentLifecycle) -> str:
    """ "high" for faults and failed reloads, "medium" for drops and degraded mode, else "informational"."""
    if record.action in LIFECYCLE_FAILURES:
        return "high"
    if record.action in LIFECYCLE_WARNINGS:
        return "medium"
    return "informational"


def drop_empty(value: dict[str, Any]) -> dict[str, Any]:
    """``value`` without its empty fields (None, "", [] and {})."""
    return {k: v for k, v in value.items() if v not in (None, "", [], {})}
