"""The one finding shape every scan output renders (table, ECS JSON, OCSF).

Data flow: a process :class:`~gpuguard.detect.score.Verdict` (plus the
process's :class:`~gpuguard.events.process_facts.ProcessFacts`) or a
:class:`~gpuguard.detect.host_checks.HostFinding` -> :class:`Finding`.
Renderers never reach back into the engine, so the agent can reuse them with
the same two builders.  Strings here are raw (attacker-controlled where they
come from a process); each renderer escapes what it prints.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from gpuguard.detect.host_checks import HostFinding
from gpuguard.events.process_facts import ProcessFacts

SEVERITY_BANDS = ((90, "critical"), (70, "high"), (40, "medium"), (1, "low"), (0, "informational"))
DEFAULT_TECHNIQUES = (("T1496", "Resource Hijacking"),)
# Names of the ATT&CK techniques rule tags cite (a tag like "T1036" names a technique).
TECHNIQUE_NAMES = {
    "T1496": "Resource Hijacking",
    "T1036": "Masquerading",
    "T1053": "Scheduled Task/Job",
    "T1190": "Exploit Public-Facing Application",
    "T1574.006": "Hijack Execution Flow: Dynamic Linker Hijacking",
    "T1610": "Deploy Container",
    "T1014": "Rootkit",
    "T1090": "Proxy",
    "T1070.004": "Indicator Removal: File Deletion",
}
_TECHNIQUE_TAG = re.compile(r"^T\d{4}(\.\d{3})?$")
SEVERITY_ORDER = {"informational": 0, "low": 1, "medium": 2, "high": 3, "critical": 4}


def severity_for_score(score: float) -> str:
    """0-100 score -> "informational" | "low" | "medium" | "high" | "critical"."""
    for floor, name in SEVERITY_BANDS:
        if score >= floor:
            return name
    return "informational"


@dataclass(slots=True)
class ProcessInfo:
    """Who the finding is about, when it is about a process."""

    pid: int
    name: str = ""
    executable: str = ""
    executable_deleted: bool = False
    command_line: list[str] = field(default_factory=list)
    start_time: float | None = None
    ppid: int | None = None
    parent_name: str | None = None
    parent_executable: str | None = None
    user_id: int | None = None
    user_name: str | None = None
    container_id: str | None = None
    container_runtime: str | None = None
    pod_uid: str | None = None
    cpu_percent: float | None = None

    @classmethod
    def from_facts(cls, facts: ProcessFacts) -> "ProcessInfo":
        parent = facts.ancestors[0] if facts.ancestors else None
        return cls(
            pid=facts.pid, name=facts.comm, executable=facts.exe, executable_deleted=facts.exe_deleted,
            command_line=list(facts.cmdline), start_time=facts.start_time or None,
            ppid=facts.ppid or None, parent_name=parent.comm if parent else None,
            parent_executable=(parent.exe or None) if parent else None,
            user_id=facts.uid if facts.uid >= 0 else None, user_name=facts.username or None,
            container_id=facts.container_id, container_runtime=facts.container_runtime,
            pod_uid=facts.pod_uid, cpu_percent=facts.cpu_percent)


@dataclass(slots=True)
class EvidenceItem:
    rule_id: str
    detail: str
    weight: float = 0.0
    signal: str = ""
    severity: str = ""
    tags: list[str] = field(default_factory=list)
    description: str = ""        # what the rule means, e.g. "executable deleted after start"

    def to_json(self) -> dict[str, Any]:
        return {"rule_id": self.rule_id, "description": self.description, "signal": self.signal, "detail": self.detail,
                "weight": self.weight, "severity": self.severity, "tags": list(self.tags)}


@dataclass(slots=True)
class Finding:
    kind: str                          # "process" | "host"
    rule_id: str                       # the rule that carries the most weight
    rule_name: str
    rule_description: str
    score: float                       # 0-100
    verdict: str                       # "clean" | "suspicious" | "malicious"
    explanation: str                   # one line
    evidence: list[EvidenceItem] = field(default_factory=list)
    categories: list[str] = field(default_factory=list)          # ECS event.category values
    techniques: list[tuple[str, str]] = field(default_factory=lambda: list(DEFAULT_TECHNIQUES))
    process: ProcessInfo | None = None
    subject: str | None = None         # host findings: the path, pid or module concerned
    allowlisted: bool = False
    action: str | None = None

    @property
    def severity(self) -> str:
        return severity_for_score(self.score)

    @property
    def reasons(self) -> str:
        """The evidence alone, one line (the table's "why" column; the explanation also names the process)."""
        if self.kind == "host" or not self.evidence:
            return self.explanation
        return "; ".join(f"{e.description or e.detail} ({e.weight:+.0f}, {e.rule_id})" for e in self.evidence)

    @property
    def rule_ids(self) -> list[str]:
        seen: list[str] = []
        for item in self.evidence:
            if item.rule_id not in seen:
                seen.append(item.rule_id)
        return seen or [self.rule_id]


def techniques_from_tags(tags: list[str]) -> list[tuple[str, str]]:
    """ATT&CK (id, name) pairs cited by rule tags, T1496 first; T1496 alone when none are."""
    found = list(DEFAULT_TECHNIQUES)
    for tag in tags:
        if _TECHNIQUE_TAG.match(tag) and tag not in (t[0] for t in found):
            found.append((tag, TECHNIQUE_NAMES.get(tag, tag)))
    return found


def finding_from_verdict(verdict: Any, facts: ProcessFacts | None, ruleset: Any = None) -> Finding:
    """A process :class:`~gpuguard.detect.score.Verdict` as a finding.

    The rule carrying the most weight names the finding (``rule_id``); every
    contributing rule stays in ``evidence``.  ``ruleset`` (optional) supplies
    that rule's description.
    """
    top = verdict.evidence[0] if verdict.evidence else None
    rule = ruleset.rule(top.rule_id) if (top is not None and ruleset is not None) else None
    process = ProcessInfo.from_facts(facts) if facts is not None else ProcessInfo(
        pid=verdict.pid, name=verdict.comm, executable=verdict.exe, executable_deleted=verdict.exe_deleted)
    categories = ["process", "intrusion_detection"]
    if any(e.rule_id.startswith("net-") for e in verdict.evidence):
        categories.append("network")
    if any(e.rule_id.startswith("yara") for e in verdict.evidence):
        categories.append("malware")
    return Finding(
        kind="process",
        rule_id=top.rule_id if top else "none",
        rule_name=top.rule_id if top else "none",
        rule_description=(rule.description if rule is not None else top.description) if top else "no evidence",
        score=float(verdict.score),
        verdict=verdict.verdict,
        explanation=verdict.explain(),
        evidence=[EvidenceItem(e.rule_id, e.detail, float(e.weight), e.signal, e.severity, list(e.tags),
                               e.description) for e in verdict.evidence],
        categories=categories,
        techniques=techniques_from_tags([t for e in verdict.evidence for t in e.tags]),
        process=process,
        allowlisted=verdict.allowlisted,
        action=verdict.action if verdict.action != "none" else None,
    )


def finding_from_host(host: HostFinding) -> Finding:
    rule = host.rule
    process = ProcessInfo(pid=host.pid, name=host.process_name or "") if host.pid is not None else None
    return Finding(
        kind="host", rule_id=rule.id, rule_name=rule.name, rule_description=rule.description,
        score=float(rule.score), verdict=host.verdict, explanation=host.explain(),
        evidence=[EvidenceItem(rule.id, line, 0.0, "host-check", severity_for_score(rule.score))
                  for line in host.evidence],
        categories=list(rule.category), techniques=list(rule.techniques),
        process=process, subject=host.subject)
