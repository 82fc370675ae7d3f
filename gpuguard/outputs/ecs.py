"""Records as Elastic Common Schema (ECS) documents: findings, response actions, agent lifecycle.

Data flow: :class:`~gpuguard.outputs.finding.Finding` -> one ECS document
(``event.kind: "alert"`` for suspicious and malicious verdicts, ``"event"``
below the threshold, so a SIEM pages only on what gpuguard calls an alert).  Layout choice: **nested JSON objects**
(``{"process": {"pid": 1}}``), not dotted keys (``{"process.pid": 1}``) —
ECS's guidelines ask for nested objects when documents are sent as JSON, and
Elasticsearch/Beats/Logstash read both the same way.  Every document uses the
same layout; nothing mixes the two.

Details: docs/internals.md, "ecs".
"""

from __future__ import annotations

import datetime as _dt
import ipaddress
import os
import socket
from typing import Any

from gpuguard import __version__
from gpuguard.events.action_kinds import ACTION_KINDS, kind_of
from gpuguard.events.agent_events import ActionOutcome, AgentLifecycle
from gpuguard.outputs.finding import (
    Finding,
    evidence_json,
    process_entity_id,
    rule_content_json,
    rule_reference,
)
from gpuguard.outputs.output_format import (
    AGENT_DATASET,
    LIFECYCLE_FAILURES,
    OutputFormat,
    drop_empty,
    json_encoder,
    lifecycle_severity,
)

ECS_VERSION = "8.11.0"
ECS_SEVERITY = {"informational": 0, "low": 21, "medium": 47, "high": 73, "critical": 99}
_ECS_ACTIVITY_TYPE = {"create": "info", "update": "change", "close": "end"}
# ECS 8.11's expected_event_types of the categories gpuguard writes (tests compare it with
# @elastic/ecs): Kibana's views and Elastic's integration checks want every event.type of a
# record expected under every one of its event.category values.
EXPECTED_EVENT_TYPES = {
    "configuration": ("access", "change", "creation", "deletion", "info"),
    "driver": ("change", "end", "info", "start"),
    "file": ("access", "change", "creation", "deletion", "info"),
    "host": ("access", "change", "end", "info", "start"),
    "intrusion_detection": ("allowed", "denied", "info"),
    "library": ("start",),
    "malware": ("info",),
    "network": ("access", "allowed", "connection", "denied", "end", "info", "protocol", "start"),
    "process": ("access", "change", "end", "info", "start"),
}
ATTACK_URL = "https://attack.mitre.org/techniques/{}/"
# What each action does, in ECS event.type terms (each action's ActionKind says).
_ACTION_ECS_TYPE = {kind.name: kind.ecs_type for kind in ACTION_KINDS}
_ACTION_OUTCOME = {"done": "success", "failed": "failure"}
# Tactics of the techniques gpuguard reports (ATT&CK Enterprise).
TECHNIQUE_TACTICS: dict[str, tuple[tuple[str, str], ...]] = {
    "T1496": (("TA0040", "Impact"),),
    "T1014": (("TA0005", "Defense Evasion"),),
    "T1564": (("TA0005", "Defense Evasion"),),
    "T1036": (("TA0005", "Defense Evasion"),),
    "T1070": (("TA0005", "Defense Evasion"),),
    "T1574": (
        ("TA0003", "Persistence"),
        ("TA0004", "Privilege Escalation"),
        ("TA0005", "Defense Evasion"),
    ),
    "T1053": (
        ("TA0002", "Execution"),
        ("TA0003", "Persistence"),
        ("TA0004", "Privilege Escalation"),
    ),
    "T1543": (("TA0003", "Persistence"), ("TA0004", "Privilege Escalation")),
    "T1546": (("TA0003", "Persistence"), ("TA0004", "Privilege Escalation")),
    "T1547": (("TA0003", "Persistence"), ("TA0004", "Privilege Escalation")),
    "T1068": (("TA0004", "Privilege Escalation"),),
    "T1090": (("TA0011", "Command and Control"),),
    "T1190": (("TA0001", "Initial Access"),),
    "T1610": (("TA0002", "Execution"), ("TA0005", "Defense Evasion")),
}


def categorization(categories: list[str], wanted: str) -> dict[str, list[str]]:
    """``event.category`` and ``event.type`` that ECS allows together: ``wanted`` when every
    category expects it, else ``info`` (an update or close of a finding whose categories do not
    all know change/end says so in event.action and gpuguard.finding); a category that expects
    neither is left out (its rule still names it in gpuguard.*)."""
    known = [c for c in dict.fromkeys(categories) if c in EXPECTED_EVENT_TYPES]
    kind = wanted if all(wanted in EXPECTED_EVENT_TYPES[c] for c in known) else "info"
    kept = [c for c in known if kind in EXPECTED_EVENT_TYPES[c]]
    return {"category": kept or (["host"] if known else []), "type": [kind]}


def iso_time(epoch: float) -> str:
    """Epoch seconds -> ``2026-11-21T10:57:00.123Z``."""
    try:
        moment = _dt.datetime.fromtimestamp(epoch, tz=_dt.UTC)
    except (OverflowError, ValueError, OSError):  # a recording or a driver can carry any number
        moment = _dt.datetime.fromtimestamp(0, tz=_dt.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def host_fields() -> dict[str, Any]:
    """ECS ``host`` object of this machine."""
    uname = os.uname()
    return {
        "hostname": socket.gethostname(),
        "name": socket.gethostname(),
        "architecture": uname.machine,
        "os": {"type": "linux", "kernel": uname.release},
    }


def threat_fields(techniques: list[tuple[str, str]]) -> dict[str, Any]:
    ids: list[str] = []
    names: list[str] = []
    sub_ids: list[str] = []
    sub_names: list[str] = []
    tactics: list[tuple[str, str]] = []
    for technique_id, name in techniques:
        parent_id, _, _ = technique_id.partition(".")
        parent_name, _, sub_name = name.partition(": ")
        if parent_id not in ids:
            ids.append(parent_id)
            names.append(parent_name)
        if technique_id != parent_id:
            sub_ids.append(technique_id)
            sub_names.append(sub_name or name)
        for tactic in TECHNIQUE_TACTICS.get(parent_id, ()):
            if tactic not in tactics:
                tactics.append(tactic)
    technique: dict[str, Any] = {
        "id": ids,
        "name": names,
        "reference": [ATTACK_URL.format(i) for i in ids],
    }
    if sub_ids:
        technique["subtechnique"] = {
            "id": sub_ids,
            "name": sub_names,
            "reference": [ATTACK_URL.format(i.replace(".", "/")) for i in sub_ids],
        }
    out: dict[str, Any] = {"framework": "MITRE ATT&CK", "technique": technique}
    if tactics:
        out["tactic"] = {"id": [t[0] for t in tactics], "name": [t[1] for t in tactics]}
    return out


def process_fields(finding: Finding, hostname: str | None = None) -> dict[str, Any]:
    """ECS ``process``, ``user``, ``container`` and ``orchestrator`` objects of a finding."""
    p = finding.process
    if p is None:
        return {}
    process = drop_empty(
        {
            "pid": p.pid,
            "entity_id": process_entity_id(hostname or socket.gethostname(), p.pid, p.start_time),
            "name": p.name,
            "executable": p.executable,
            "command_line": " ".join(p.command_line) if p.command_line else None,
            "args": list(p.command_line) or None,
            "args_count": len(p.command_line) or None,
            "start": iso_time(p.start_time) if p.start_time else None,
            "parent": drop_empty(
                {"pid": p.ppid, "name": p.parent_name, "executable": p.parent_executable}
            ),
            "hash": {"sha256": p.exe_sha256} if p.exe_sha256 else None,
            "exit_code": p.exit_code,
        }
    )
    out: dict[str, Any] = {"process": process}
    user = drop_empty(
        {"id": str(p.user_id) if p.user_id is not None else None, "name": p.user_name}
    )
    if user:
        out["user"] = user
    if p.container_id:
        out["container"] = drop_empty(
            {
                "id": p.container_id,
                "runtime": p.container_runtime,
                "name": p.container_name,
                "image": {"name": p.container_image} if p.container_image else None,
            }
        )
    if p.pod_uid:
        out["orchestrator"] = drop_empty(
            {
                "type": "kubernetes",
                "namespace": p.pod_namespace,
                "resource": drop_empty({"type": "pod", "id": p.pod_uid, "name": p.pod_name}),
            }
        )
    return out


def destination_fields(finding: Finding) -> dict[str, Any]:
    """ECS ``destination`` of the endpoint the process dialled most, when the agent saw one."""
    if not finding.destinations:
        return {}
    top = finding.destinations[0]
    out: dict[str, Any] = {"address": top.address, "port": top.port}
    try:
        out["ip"] = str(ipaddress.ip_address(top.address))
    except ValueError:
        pass
    if top.domain:
        out["domain"] = top.domain
    return {"destination": out}


def finding_fields(finding: Finding) -> dict[str, Any] | None:
    """``gpuguard.finding``: the finding's id, the record's number and activity, what grew, totals."""
    if not finding.finding_id:
        return None
    return drop_empty(
        {
            "id": finding.finding_id,
            "sequence": finding.sequence,
            "activity": finding.activity,
            "run_id": finding.run_id,
            "continued": finding.continued or None,
            "changes": list(finding.changes),
            "totals": finding.totals,
        }
    )


def finding_to_ecs(
    finding: Finding,
    created: float,
    host: dict[str, Any] | None = None,
    dataset: str = "gpuguard.scan",
) -> dict[str, Any]:
    """One ECS document for ``finding``: an alert when its verdict is suspicious or malicious.

    A finding the agent closes (its condition went away) is an ``event`` with
    ``event.action`` ``KIND-resolved`` (``process-ended``) and ``event.type`` ``end`` where its
    categories allow it; an update has ``change`` where they allow it (:func:`categorization`).
    """
    closed = finding.activity == "close"
    ended = closed and finding.kind == "process"  # a process finding closes when the process ends
    end_word = "ended" if ended else "resolved"
    doc: dict[str, Any] = {
        "@timestamp": iso_time(created),
        "ecs": {"version": ECS_VERSION},
        "message": f"{end_word}: {finding.explanation}" if closed else finding.explanation,
        "event": {
            "kind": "alert" if finding.is_alert and not closed else "event",
            "action": f"{finding.kind}-{end_word if closed else finding.verdict}",  # e.g. "process-malicious"
            **categorization(finding.categories, _ECS_ACTIVITY_TYPE.get(finding.activity, "info")),
            "risk_score": round(float(finding.score), 1),
            "severity": ECS_SEVERITY[finding.severity],
            "module": "gpuguard",
            "dataset": dataset,
            "created": iso_time(created),
        },
        "rule": {
            "id": finding.rule_id,
            "name": finding.rule_name,
            "description": finding.rule_description,
            "ruleset": "gpuguard",
            "version": __version__,
        },
        "threat": threat_fields(finding.techniques),
    }
    reference = rule_reference(finding)
    if reference:
        doc["rule"]["reference"] = reference
    if finding.finding_id:
        doc["event"]["id"] = finding.record_id
        doc["event"]["sequence"] = finding.sequence
    totals = finding.totals or {}
    if totals.get("started") and totals.get("ended"):
        doc["event"]["start"] = iso_time(totals["started"])
        doc["event"]["end"] = iso_time(totals["ended"])
        doc["event"]["duration"] = int(max(0.0, totals["ended"] - totals["started"]) * 1e9)
    if host:
        doc["host"] = host
    doc.update(process_fields(finding, (host or {}).get("hostname")))
    if ended and "process" in doc and totals.get("ended"):
        doc["process"]["end"] = iso_time(totals["ended"])
    doc.update(destination_fields(finding))
    if finding.kind == "host" and finding.subject and finding.subject.startswith("/"):
        doc["file"] = {"path": finding.subject}
    doc["gpuguard"] = drop_empty(
        {
            "kind": finding.kind,
            "score": round(float(finding.score), 1),
            **finding.score_cap_fields(),
            "verdict": finding.verdict,
            "severity": finding.severity,
            "explanation": finding.explanation,
            "subject": finding.subject,
            "rule_ids": finding.rule_ids,
            # event.category is a list (ES|QL compares a list to null): one value to select on
            "network_evidence": "network" in finding.categories,
            "evidence": [evidence_json(e) for e in finding.evidence],
            "allowlisted": finding.allowlisted or None,
            "action": finding.action,
            "executable_deleted": finding.process.executable_deleted
            if finding.process and finding.process.executable_deleted
            else None,
            "cpu_percent": finding.process.cpu_percent if finding.process else None,
            "destinations": [d.to_json() for d in finding.destinations],
            "gpu": finding.gpu.to_json() if finding.gpu is not None else None,
            "host_gpu": finding.host_gpu,
            "status": end_word
            if closed
            else "active"
            if finding.host_gpu is not None or finding.finding_id
            else None,
            "evidence_omitted": finding.evidence_omitted or None,
            "finding": finding_fields(finding),
            "response": finding.response,
            # the top rule's tier, false positives, references and runbook (ECS has no field)
            "rule": rule_content_json(finding),
            "ancestors": finding.process.ancestors if finding.process else None,
            "kubernetes_unknown": finding.process.kubernetes_unknown if finding.process else None,
        }
    )
    return doc


def action_to_ecs(outcome: ActionOutcome, host: dict[str, Any]) -> dict[str, Any]:
    """One ECS event for a response action and how it ended."""
    hostname = host.get("hostname", "")
    process = drop_empty(
        {
            "pid": outcome.pid or None,
            "name": outcome.comm,
            "executable": outcome.exe,
            "entity_id": process_entity_id(hostname, outcome.pid, outcome.start_time)
            if outcome.pid
            else None,
            "start": iso_time(outcome.start_time) if outcome.start_time else None,
        }
    )
    kind = kind_of(outcome.action)
    doc: dict[str, Any] = {
        "@timestamp": iso_time(outcome.time),
        "ecs": {"version": ECS_VERSION},
        "message": (
            f"{outcome.action} {outcome.status}: {outcome.reason}"
            if outcome.reason
            else f"{outcome.action} {outcome.status}"
        ),
        "event": {
            "kind": "event",
            **categorization([kind.ecs_category], kind.ecs_type),
            "action": outcome.action,
            "outcome": _ACTION_OUTCOME.get(outcome.status, "unknown"),
            "module": "gpuguard",
            "dataset": AGENT_DATASET,
            "created": iso_time(outcome.time),
        },
        "host": host,
    }
    if process:
        doc["process"] = process
    if outcome.rule_ids:
        doc["rule"] = {"id": outcome.rule_ids[0], "ruleset": "gpuguard"}
    addresses = outcome.detail.get("addresses") if isinstance(outcome.detail, dict) else None
    if isinstance(addresses, list) and addresses and isinstance(addresses[0], str):
        doc["destination"] = {"address": addresses[0]}
    doc["gpuguard"] = drop_empty(
        {
            "kind": "action",
            "action": outcome.action,
            "status": outcome.status,
            "verdict": outcome.verdict,
            "score": outcome.score,
            "rule_ids": list(outcome.rule_ids),
            "reason": outcome.reason,
            "block_id": outcome.block_id,
            "expires": iso_time(outcome.expires) if outcome.expires else None,
            "detail": outcome.detail,
        }
    )
    return doc


def lifecycle_to_ecs(record: AgentLifecycle, host: dict[str, Any]) -> dict[str, Any]:
    """One ECS event for the agent's own start, reload, stop, drops or fault."""
    category = ["configuration"] if record.action.startswith("reload") else ["process"]
    event_type = {
        "start": "start",
        "start-failed": "start",
        "stop": "end",
        "reload": "change",
        "reload-failed": "change",
    }.get(record.action, "info")
    outcome = "failure" if record.action in LIFECYCLE_FAILURES else "success"
    return {
        "@timestamp": iso_time(record.time),
        "ecs": {"version": ECS_VERSION},
        "message": record.message or record.action,
        "event": {
            "kind": "event",
            **categorization(category, event_type),
            "action": record.action,
            "outcome": outcome,
            "module": "gpuguard",
            "dataset": AGENT_DATASET,
            "created": iso_time(record.time),
        },
        "log": {
            "level": {"high": "error", "medium": "warning"}.get(lifecycle_severity(record), "info")
        },
        "host": host,
        "service": {"name": "gpuguard", "type": "gpuguard", "version": __version__},
        "gpuguard": drop_empty(
            {"kind": "lifecycle", "action": record.action, "detail": record.detail}
        ),
    }


# The fields a record keeps when nothing else fits its budget (bounded by construction).
_ECS_SKELETON = (
    "@timestamp", "ecs.version", "message", "event.kind", "event.action", "event.category",
    "event.type", "event.outcome", "event.risk_score", "event.severity", "event.module",
    "event.dataset", "event.created", "rule.id", "rule.ruleset", "host.hostname", "host.name",
    "process.pid", "process.entity_id", "gpuguard.kind", "gpuguard.action", "gpuguard.status",
    "gpuguard.verdict", "gpuguard.score", "event.id", "event.sequence", "gpuguard.finding.id",
    "gpuguard.finding.sequence", "gpuguard.finding.activity", "gpuguard.finding.continued",
)  # fmt: skip

FORMAT = OutputFormat(
    name="ecs",
    doc="Elastic Common Schema JSON, one document a line (the default)",
    finding=lambda finding, created, to: finding_to_ecs(
        finding, created, to.host, dataset=to.dataset
    ),
    action=lambda outcome, to: action_to_ecs(outcome, to.host),
    lifecycle=lambda record, to: lifecycle_to_ecs(record, to.host),
    encode=json_encoder(("gpuguard",), _ECS_SKELETON),
    mark_path=("gpuguard",),
    scan_option="json",
    scan_help="ECS field names",
    scan_schema={"name": "ecs", "version": ECS_VERSION},
)
