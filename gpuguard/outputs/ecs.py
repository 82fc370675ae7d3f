"""Findings as Elastic Common Schema (ECS) documents.

Data flow: :class:`~gpuguard.outputs.finding.Finding` -> one ECS document
(``event.kind: "alert"`` for suspicious and malicious verdicts, ``"event"``
below the threshold, so a SIEM pages only on what gpuguard calls an alert).  Layout choice: **nested JSON objects**
(``{"process": {"pid": 1}}``), not dotted keys (``{"process.pid": 1}``) —
ECS's guidelines ask for nested objects when documents are sent as JSON, and
Elasticsearch/Beats/Logstash read both the same way.  Every document uses the
same layout; nothing mixes the two.

Field use:

* ``process.*`` (pid, entity_id, name, executable, command_line, args, start,
  parent.{pid,name,executable}), ``user.{id,name}``, ``container.{id,runtime}``,
  ``orchestrator.{type,resource.{type,id}}`` for the Kubernetes pod uid;
* ``rule.{id,name,description,ruleset}`` — the rule carrying the most weight;
  every rule that contributed is in ``gpuguard.evidence``;
* ``event.{kind,action,category,type,risk_score,severity,module,dataset,created}``
  (``event.action`` is ``KIND-VERDICT``, e.g. ``process-malicious``);
  ``event.severity`` follows Elastic's detection-rule numbers (21 low,
  47 medium, 73 high, 99 critical);
* ``threat.framework: "MITRE ATT&CK"`` with technique ids/names (and
  sub-techniques under ``threat.technique.subtechnique``) and their tactics;
* ``destination.{address,ip,port,domain}`` — the endpoint the process dialled
  most (the agent knows it; ``scan`` does not), every endpoint under
  ``gpuguard.destinations``;
* gpuguard's own view under ``gpuguard.*`` (score, verdict, evidence, gpu, ...);
* the agent's process findings (gpuguard/agent/findings.py): ``event.id`` (finding id and
  record number), ``event.sequence``, ``gpuguard.finding`` {id, sequence, activity, changes,
  totals}, ``process.hash.sha256``, the parent chain in ``gpuguard.ancestors``; a close is
  ``event.type: ["end"]`` with ``event.start``/``end``/``duration`` and ``process.exit_code``.

Every field carries the exact value; the one JSON escaping rule
(:mod:`gpuguard.outputs.jsonl`) makes control characters and bytes that are
not UTF-8 harmless when the document is written.
"""

from __future__ import annotations

import datetime as _dt
import ipaddress
import os
import socket
from typing import Any

from gpuguard import __version__
from gpuguard.outputs.finding import Finding, process_entity_id

ECS_VERSION = "8.11.0"
ECS_SEVERITY = {"informational": 0, "low": 21, "medium": 47, "high": 73, "critical": 99}
_ECS_ACTIVITY_TYPE = {"create": "info", "update": "change", "close": "end"}
ATTACK_URL = "https://attack.mitre.org/techniques/{}/"
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


def _drop_empty(value: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in value.items() if v not in (None, "", [], {})}


def process_fields(finding: Finding, hostname: str | None = None) -> dict[str, Any]:
    """ECS ``process``, ``user``, ``container`` and ``orchestrator`` objects of a finding."""
    p = finding.process
    if p is None:
        return {}
    process = _drop_empty(
        {
            "pid": p.pid,
            "entity_id": process_entity_id(hostname or socket.gethostname(), p.pid, p.start_time),
            "name": p.name,
            "executable": p.executable,
            "command_line": " ".join(p.command_line) if p.command_line else None,
            "args": list(p.command_line) or None,
            "args_count": len(p.command_line) or None,
            "start": iso_time(p.start_time) if p.start_time else None,
            "parent": _drop_empty(
                {"pid": p.ppid, "name": p.parent_name, "executable": p.parent_executable}
            ),
            "hash": {"sha256": p.exe_sha256} if p.exe_sha256 else None,
            "exit_code": p.exit_code,
        }
    )
    out: dict[str, Any] = {"process": process}
    user = _drop_empty(
        {"id": str(p.user_id) if p.user_id is not None else None, "name": p.user_name}
    )
    if user:
        out["user"] = user
    if p.container_id:
        out["container"] = _drop_empty(
            {"id": p.container_id, "runtime": p.container_runtime, "name": p.container_name}
        )
    if p.pod_uid:
        out["orchestrator"] = _drop_empty(
            {
                "type": "kubernetes",
                "namespace": p.pod_namespace,
                "resource": _drop_empty({"type": "pod", "id": p.pod_uid, "name": p.pod_name}),
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
    return _drop_empty(
        {
            "id": finding.finding_id,
            "sequence": finding.sequence,
            "activity": finding.activity,
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
    ``event.type: ["end"]`` and ``event.action`` ``KIND-resolved``; one it
    updates has ``event.type: ["change"]``.
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
            "category": list(finding.categories),
            "type": [_ECS_ACTIVITY_TYPE.get(finding.activity, "info")],
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
    doc["gpuguard"] = _drop_empty(
        {
            "kind": finding.kind,
            "score": round(float(finding.score), 1),
            "verdict": finding.verdict,
            "severity": finding.severity,
            "explanation": finding.explanation,
            "subject": finding.subject,
            "rule_ids": finding.rule_ids,
            "evidence": [e.to_json() for e in finding.evidence],
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
            "ancestors": finding.process.ancestors if finding.process else None,
        }
    )
    return doc
