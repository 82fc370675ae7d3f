"""The one finding shape every scan output renders (table, ECS JSON, OCSF).

Data flow: a process :class:`~gpuguard.detect.scoring.score.Verdict` (plus the
process's :class:`~gpuguard.events.process_facts.ProcessFacts`) or a
:class:`~gpuguard.detect.host.checks.HostFinding` -> :class:`Finding`.
Renderers never reach back into the engine, so the agent can reuse them with
the same two builders.  Strings here are raw (attacker-controlled where they
come from a process); each renderer escapes what it prints.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

from gpuguard.correlate.state import ProcessState
from gpuguard.detect.host.checks import HostFinding
from gpuguard.detect.ruleset.model import ALERT_VERDICTS, CATEGORY_OF_TAG, RuleContent
from gpuguard.detect.scoring.cap import ScoreCap
from gpuguard.detect.scoring.rule import severity_for
from gpuguard.detect.scoring.score import Evidence
from gpuguard.events.devices import GPU_NODE_CLASS_NAMES
from gpuguard.events.process_facts import ProcessFacts

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
MAX_DESTINATIONS = 8
PARENT_CHAIN = 3  # ancestors a record names (parent, grandparent, great-grandparent)


def evidence_json(evidence: Evidence) -> dict[str, Any]:
    """A piece of a finding's evidence as a record writes it: the weight as a float (40.0), as
    finding records always have, so the field's type in a SIEM's index stays the same."""
    return {**evidence.to_json(), "weight": float(evidence.weight)}


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
    # parent first, at most PARENT_CHAIN: {"pid", "name", "executable"}
    ancestors: list[dict[str, Any]] = field(default_factory=list)
    exe_sha256: str | None = None
    exit_code: int | None = None  # a close record's, when the exit was seen
    # Kubernetes names from the kubelet's log tree (sources/proc/pod_names.py), when known
    pod_name: str | None = None
    pod_namespace: str | None = None
    container_name: str | None = None
    container_image: str | None = None  # from the container runtime's state on the node
    # of a process in a pod or container: the names the node did not know (namespace, pod,
    # container, image), so a record says a field is unknown rather than leaving it out
    kubernetes_unknown: list[str] = field(default_factory=list)

    @classmethod
    def from_facts(cls, facts: ProcessFacts) -> ProcessInfo:
        parent = facts.ancestors[0] if facts.ancestors else None
        return cls(
            pid=facts.pid,
            name=facts.comm,
            executable=facts.exe,
            executable_deleted=facts.exe_deleted,
            command_line=list(facts.cmdline),
            start_time=facts.start_time or None,
            ppid=facts.ppid or None,
            parent_name=parent.comm if parent else None,
            parent_executable=(parent.exe or None) if parent else None,
            user_id=facts.uid if facts.uid >= 0 else None,
            user_name=facts.username or None,
            container_id=facts.container_id,
            container_runtime=facts.container_runtime,
            pod_uid=facts.pod_uid,
            pod_name=facts.pod_name,
            pod_namespace=facts.pod_namespace,
            container_name=facts.container_name,
            container_image=facts.container_image,
            cpu_percent=facts.cpu_percent,
            ancestors=[
                {"pid": a.pid, "name": a.comm, "executable": a.exe}
                for a in facts.ancestors[:PARENT_CHAIN]
            ],
        )


@dataclass(slots=True)
class Destination:
    """A remote endpoint the process connected to (the pool, when the evidence is about one)."""

    address: str
    port: int
    attempts: int = 1
    domain: str | None = (
        None  # the name it asked for (TLS SNI, HTTP Host, proxy target), when one was seen
    )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "address": self.address,
            "port": self.port,
            "attempts": self.attempts,
        }
        if self.domain:
            out["domain"] = self.domain
        return out


@dataclass(slots=True)
class GpuUse:
    """What the process did with GPUs, from the correlator's state."""

    device_classes: list[str] = field(default_factory=list)  # "nvidia", "dri", ...
    device_paths: list[str] = field(default_factory=list)
    util_mean: float | None = None  # percent, over the usage window
    memory_used: int | None = None  # bytes, latest sample
    ioctl_total: int = 0
    memory_total: int | None = None  # bytes, of the devices it uses
    shared: bool | None = None  # another process used one of its GPUs in the latest sample

    @property
    def memory_share(self) -> float | None:
        """Its share of its devices' memory (0-1), when both are known."""
        if self.memory_used is None or not self.memory_total:
            return None
        return round(min(1.0, self.memory_used / self.memory_total), 4)

    def to_json(self) -> dict[str, Any]:
        out = {
            "device_classes": self.device_classes,
            # one value a SIEM rule can select on (device_classes is a list: docs/siem.md)
            "node_opened": any(c in GPU_NODE_CLASS_NAMES for c in self.device_classes),
            "device_paths": self.device_paths,
            "util_mean": None if self.util_mean is None else round(self.util_mean, 1),
            "memory_used": self.memory_used,
            "ioctl_total": self.ioctl_total,
        }
        if self.memory_total:
            out["memory_total"] = self.memory_total
            out["memory_share"] = self.memory_share
        if self.shared is not None:
            out["shared"] = self.shared
        return out


@dataclass(slots=True)
class Finding:
    kind: str  # "process" | "host"
    rule_id: str  # the rule that carries the most weight
    rule_name: str
    rule_description: str
    score: float  # 0-100
    verdict: str  # "clean" | "suspicious" | "malicious"
    explanation: str  # one line
    evidence: list[Evidence] = field(default_factory=list)
    categories: list[str] = field(default_factory=list)  # ECS event.category values
    techniques: list[tuple[str, str]] = field(default_factory=lambda: list(DEFAULT_TECHNIQUES))
    process: ProcessInfo | None = None
    subject: str | None = None  # host findings: the path, pid or module concerned
    allowlisted: bool = False
    action: str | None = None
    destinations: list[Destination] = field(default_factory=list)  # most attempted first
    gpu: GpuUse | None = None
    created: float = 0.0  # when the verdict was made (epoch seconds); 0: not known
    # The agent's host findings persist and end: "create" (first seen), "update" (a material
    # change), "close" (the condition went away).  Process verdicts and scan findings are "create".
    activity: str = "create"
    host_gpu: dict[str, Any] | None = (
        None  # GPU host findings: device, memory_bytes, owner_pid, status
    )
    # a process score held below suspicious because only generic rules matched (None: not capped)
    score_cap: ScoreCap | None = None
    evidence_omitted: int = 0  # pieces of evidence a log record left out (outputs/bounds.py)
    # The agent's process findings (gpuguard/agent/stages/s5_report/findings.py): one id for the life of the
    # finding, the record's number in it (0 = create), what grew since the previous record,
    # and on close the lifetime totals (age_s, gpu_s, gpu_memory_peak, bytes_out, bytes_in,
    # actions, started, ended).  ``run_id``: the agent run that wrote the record; ``continued``:
    # this record picks up a finding an earlier run left open (docs/siem.md, "Restarts").
    finding_id: str | None = None
    sequence: int = 0
    changes: list[str] = field(default_factory=list)
    totals: dict[str, Any] | None = None
    run_id: str | None = None
    continued: bool = False
    # What enforce mode does or would do with it, rule by rule, and why not (respond.intent):
    # on the records of an alert the agent hands its responder; None when nothing would act.
    response: dict[str, Any] | None = None
    # The top rule's tier and what it tells operators (false positives, references, runbook)
    rule_maturity: str | None = None
    rule_content: RuleContent | None = None

    def score_cap_fields(self) -> dict[str, Any]:
        """Whether a process finding's score was capped, and why (every output's record says)."""
        if self.kind != "process":
            return {}
        cap = self.score_cap
        return {
            "score_capped": cap is not None,
            **({"score_cap": cap.to_json()} if cap is not None else {}),
        }

    @property
    def record_id(self) -> str | None:
        """Unique per record (ECS ``event.id``): the finding id, the agent run's id (unique
        across restarts) and the record's number."""
        if not self.finding_id:
            return None
        if self.run_id:
            return f"{self.finding_id}-{self.run_id}-{self.sequence}"
        return f"{self.finding_id}-{self.sequence}"

    @property
    def severity(self) -> str:
        return severity_for(self.score)

    @property
    def is_alert(self) -> bool:
        """A verdict at or above the suspicious threshold; a clean finding is only an event."""
        return self.verdict in ALERT_VERDICTS

    @property
    def reasons(self) -> str:
        """The evidence alone, one line (the table's "why" column; the explanation also names the process)."""
        if self.kind == "host" or not self.evidence:
            return self.explanation
        return "; ".join(
            f"{e.description or e.detail} ({e.weight:+.0f}, {e.rule_id})" for e in self.evidence
        )

    @property
    def rule_ids(self) -> list[str]:
        seen: list[str] = []
        for item in self.evidence:
            if item.rule_id not in seen:
                seen.append(item.rule_id)
        return seen or [self.rule_id]


def process_entity_id(hostname: str, pid: int, start_time: float | None) -> str:
    """One process on one host, stable across events and distinct from a later process with its pid
    (ECS ``process.entity_id``, OCSF ``process.uid``)."""
    text = f"{hostname}|{pid}|{start_time or 0:.2f}"
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def techniques_from_tags(tags: list[str]) -> list[tuple[str, str]]:
    """ATT&CK (id, name) pairs cited by rule tags, T1496 first; T1496 alone when none are."""
    found = list(DEFAULT_TECHNIQUES)
    for tag in tags:
        if _TECHNIQUE_TAG.match(tag) and tag not in (t[0] for t in found):
            found.append((tag, TECHNIQUE_NAMES.get(tag, tag)))
    return found


def destinations_of(state: ProcessState) -> list[Destination]:
    """The process's remote endpoints, most attempted first (bounded)."""
    ranked = sorted(state.connections.items(), key=lambda item: (-item[1], item[0]))[
        :MAX_DESTINATIONS
    ]
    hosts = sorted(state.network.payload_hosts | state.network.proxy_hosts)
    domain = hosts[0] if len(hosts) == 1 else None  # one name seen: it is the one they dialled
    return [Destination(address, port, attempts, domain) for (address, port), attempts in ranked]


def gpu_use_of(state: ProcessState) -> GpuUse | None:
    """The process's GPU use, or None when it never touched one."""
    if not (
        state.gpu_paths or state.gpu_device_classes or len(state.gpu_util) or state.ioctl_total
    ):
        return None
    memory = state.gpu_memory.latest
    return GpuUse(
        sorted(state.gpu_device_classes),
        sorted(state.gpu_paths),
        state.gpu_util.mean,
        int(memory) if memory is not None else None,
        state.ioctl_total,
        state.gpu_memory_total,
        state.gpu_device_shared,
    )


def finding_from_verdict(
    verdict: Any, facts: ProcessFacts | None, ruleset: Any = None, state: ProcessState | None = None
) -> Finding:
    """A process :class:`~gpuguard.detect.scoring.score.Verdict` as a finding.

    The rule carrying the most weight names the finding (``rule_id``); every
    contributing rule stays in ``evidence``.  ``ruleset`` (optional) supplies
    that rule's description; ``state`` (the correlator's, optional) supplies
    the remote endpoints and GPU use the agent's log records carry.
    """
    top = verdict.evidence[0] if verdict.evidence else None
    rule = ruleset.rule(top.rule_id) if (top is not None and ruleset is not None) else None
    process = (
        ProcessInfo.from_facts(facts)
        if facts is not None
        else ProcessInfo(
            pid=verdict.pid,
            name=verdict.comm,
            executable=verdict.exe,
            executable_deleted=verdict.exe_deleted,
        )
    )
    if state is not None:
        # What the process runs now: an exec seen after the facts were read renames it (a shell
        # that execs a miner is the miner, not the shell), and the hash is of that image.
        process.name = state.comm or process.name
        process.executable = state.exe or process.executable
        process.exe_sha256 = state.exe_sha256
    categories = ["process", "intrusion_detection"]  # and each rule's own (Rule.categories)
    for category in CATEGORY_OF_TAG.values():
        if any(category in e.categories for e in verdict.evidence):
            categories.append(category)
    return Finding(
        kind="process",
        rule_id=top.rule_id if top else "none",
        rule_name=top.rule_id if top else "none",
        rule_description=(rule.description if rule is not None else top.description)
        if top
        else "no evidence",
        score=float(verdict.score),
        verdict=verdict.verdict,
        explanation=verdict.explain(),
        evidence=list(verdict.evidence),
        categories=categories,
        techniques=techniques_from_tags([t for e in verdict.evidence for t in e.tags]),
        process=process,
        allowlisted=verdict.allowlisted,
        score_cap=verdict.cap,
        action=verdict.action if verdict.action != "none" else None,
        destinations=destinations_of(state) if state is not None else [],
        gpu=gpu_use_of(state) if state is not None else None,
        created=float(getattr(verdict, "time", 0.0) or 0.0),
        rule_maturity=rule.maturity if rule is not None else None,
        rule_content=rule.content if rule is not None else None,
    )


def rule_content_json(finding: Finding) -> dict[str, Any] | None:
    """The top rule's tier and operator content as a record carries it (None: none known)."""
    content = finding.rule_content
    if finding.rule_maturity is None and content is None:
        return None
    out: dict[str, Any] = {"maturity": finding.rule_maturity}
    if content is not None:
        if content.false_positives:
            out["false_positives"] = list(content.false_positives)
        if content.references:
            out["references"] = [r.link for r in content.references]
        if content.runbook:
            out["runbook"] = content.runbook
    return out


def rule_reference(finding: Finding) -> str | None:
    """The top rule's first reference that is not an ATT&CK page (those are in threat.*), else
    its first."""
    content = finding.rule_content
    if content is None or not content.references:
        return None
    links = [r for r in content.references if r.url] or list(content.references)
    return links[0].link


def finding_from_host(host: HostFinding, activity: str = "create", created: float = 0.0) -> Finding:
    """A host check's finding; ``activity`` is the agent's "create" | "update" | "close" (see :class:`Finding`)."""
    rule = host.rule
    process = (
        ProcessInfo(pid=host.pid, name=host.process_name or "") if host.pid is not None else None
    )
    host_gpu = None
    if host.device is not None:
        host_gpu = {
            "device": host.device,
            "memory_bytes": host.amount,
            "owner_pid": host.pid,
            "status": "resolved" if activity == "close" else "active",
        }
    return Finding(
        kind="host",
        rule_id=rule.id,
        rule_name=rule.name,
        rule_description=rule.description,
        score=float(rule.score),
        verdict=host.verdict,
        explanation=host.explain(),
        evidence=[
            Evidence(rule.id, "host-check", line, 0, severity_for(rule.score))
            for line in host.evidence
        ],
        categories=list(rule.category),
        techniques=list(rule.techniques),
        process=process,
        subject=host.subject,
        activity=activity,
        host_gpu=host_gpu,
        created=created,
    )
