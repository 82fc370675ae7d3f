"""Records as OCSF 1.3 events: Detection Finding, Remediation and Application Lifecycle.

Data flow: :class:`~gpuguard.outputs.finding.Finding` -> one OCSF 1.x event.

Details: docs/internals.md, "ocsf".
"""

from __future__ import annotations

import hashlib
import ipaddress
import socket
from typing import Any

from gpuguard import __version__
from gpuguard.events.action_kinds import kind_of
from gpuguard.events.agent_events import ActionOutcome, AgentLifecycle
from gpuguard.outputs.ecs import TECHNIQUE_TACTICS, finding_fields
from gpuguard.outputs.finding import Finding, process_entity_id
from gpuguard.outputs.output_format import (
    LIFECYCLE_FAILURES,
    OutputFormat,
    drop_empty,
    json_encoder,
    lifecycle_severity,
)

OCSF_VERSION = "1.3.0"
PROFILES = ("host",)  # every record carries ``device`` (the host profile's attribute)
CLASS_UID = 2004
CLASS_NAME = "Detection Finding"
CATEGORY_UID = 2
CATEGORY_NAME = "Findings"
# The agent's host findings: (activity_id, activity_name, status_id, status) for create, update, close.
ACTIVITIES = {
    "create": (1, "Create", 1, "New"),
    "update": (2, "Update", 2, "In Progress"),
    "close": (3, "Close", 4, "Resolved"),
}
SEVERITY_ID = {"informational": 1, "low": 2, "medium": 3, "high": 4, "critical": 5}
SEVERITY_NAME = {1: "Informational", 2: "Low", 3: "Medium", 4: "High", 5: "Critical"}
ANALYTIC_RULE = 1
SHA256_ALGORITHM = 3  # OCSF Fingerprint algorithm_id
# What each action does, in OCSF remediation terms; the agent's own lifecycle steps.
_OCSF_CLASS_NAME = {
    7001: "Remediation Activity",
    7003: "Process Remediation Activity",
    7004: "Network Remediation Activity",
}
_LIFECYCLE_OCSF = {
    "start": (3, "Start"),
    "start-failed": (3, "Start"),
    "stop": (4, "Stop"),
    "reload": (8, "Update"),
    "reload-failed": (8, "Update"),
}


def metadata(container: bool = False) -> dict[str, Any]:
    """OCSF ``metadata``: schema version, the profiles used, the product.

    Every record uses the ``host`` profile (it brings ``device``); one whose
    process runs in a container also the ``container`` profile (``process.container``).
    """
    return {
        "version": OCSF_VERSION,
        "profiles": [*PROFILES, "container"] if container else list(PROFILES),
        "product": {"name": "gpuguard", "vendor_name": "gpuguard", "version": __version__},
    }


def _ms(epoch: float) -> int:
    return int(round(epoch * 1000))


def _file_object(path: str, type_id: int = 1) -> dict[str, Any]:
    """An OCSF File for ``path`` (``type_id`` 1: a regular file, an executable; 0: unknown)."""
    return {"path": path, "name": path.rsplit("/", 1)[-1], "type_id": type_id}


def finding_uid(finding: Finding, hostname: str) -> str:
    """Stable id: the agent's finding id (one per process finding, through its updates and close);
    otherwise the same process (pid + start time) or subject and rule on the same host."""
    if finding.finding_id:
        return finding.finding_id
    if finding.process is not None and finding.process.start_time:
        subject = f"{finding.process.pid}@{finding.process.start_time}"
    else:
        subject = finding.subject or ""
    key = f"{hostname}|{finding.kind}|{finding.rule_id}|{subject}"
    try:
        data = key.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate no decoder of ours makes: keep it distinct
        data = key.encode("utf-8", "surrogatepass")
    digest = hashlib.sha256(data)
    return f"gpuguard-{digest.hexdigest()[:32]}"


def process_object(finding: Finding, hostname: str | None = None) -> dict[str, Any] | None:
    p = finding.process
    if p is None:
        return None
    process: dict[str, Any] = {"pid": p.pid, "name": p.name}
    if hostname:
        process["uid"] = process_entity_id(hostname, p.pid, p.start_time)  # = ECS process.entity_id
    if p.executable:
        process["file"] = _file_object(p.executable)
    if p.command_line:
        process["cmd_line"] = " ".join(p.command_line)
    if p.start_time:
        process["created_time"] = _ms(p.start_time)
    if p.user_id is not None or p.user_name:
        process["user"] = {
            k: v
            for k, v in (
                ("uid", None if p.user_id is None else str(p.user_id)),
                ("name", p.user_name),
            )
            if v is not None
        }
    if p.exe_sha256 and "file" in process:
        process["file"]["hashes"] = [
            {"algorithm_id": SHA256_ALGORITHM, "algorithm": "SHA-256", "value": p.exe_sha256}
        ]
    if p.ppid:
        chain = list(p.ancestors) or [{"pid": p.ppid}]
        if chain[0].get("pid") != p.ppid:
            chain = [{"pid": p.ppid}]
        chain[0] = {
            "pid": p.ppid,
            "name": p.parent_name or chain[0].get("name"),
            "executable": p.parent_executable or chain[0].get("executable"),
        }
        # parent_process nests: the parent's parent_process is the grandparent, and so on
        outer: dict[str, Any] = process
        for ancestor in chain:
            parent = _ancestor_object(ancestor)
            outer["parent_process"] = parent
            outer = parent
    if p.container_id:
        process["container"] = container_object(finding)
    return process


def _ancestor_object(ancestor: dict[str, Any]) -> dict[str, Any]:
    parent: dict[str, Any] = {"pid": ancestor["pid"]}
    if ancestor.get("name"):
        parent["name"] = ancestor["name"]
    path = ancestor.get("executable")
    if path:
        parent["file"] = _file_object(path)
    return parent


def container_object(finding: Finding) -> dict[str, Any] | None:
    p = finding.process
    if p is None or not p.container_id:
        return None
    container: dict[str, Any] = {"uid": p.container_id}
    if p.container_name:
        container["name"] = p.container_name
    if p.container_runtime:
        container["runtime"] = p.container_runtime
    if p.pod_uid:
        container["pod_uuid"] = p.pod_uid
    return container


def dst_endpoint(finding: Finding) -> dict[str, Any] | None:
    """OCSF Network Endpoint of the address the process dialled most, when the agent saw one."""
    if not finding.destinations:
        return None
    top = finding.destinations[0]
    try:
        endpoint: dict[str, Any] = {"ip": str(ipaddress.ip_address(top.address))}
    except ValueError:
        endpoint = {"hostname": top.address}
    endpoint["port"] = top.port
    if top.domain:
        endpoint["domain"] = top.domain
    return endpoint


def attacks(finding: Finding) -> list[dict[str, Any]]:
    out = []
    for technique_id, name in finding.techniques:
        parent = technique_id.partition(".")[0]
        attack: dict[str, Any] = {
            "technique": {"uid": technique_id, "name": name},
            "version": "v15",
        }
        tactics = TECHNIQUE_TACTICS.get(parent, ())
        if tactics:
            attack["tactic"] = {"uid": tactics[0][0], "name": tactics[0][1]}
            attack["tactics"] = [{"uid": uid, "name": tname} for uid, tname in tactics]
        out.append(attack)
    return out


def finding_to_ocsf(
    finding: Finding, created: float, hostname: str | None = None
) -> dict[str, Any]:
    """One OCSF Detection Finding for ``finding``."""
    hostname = hostname or socket.gethostname()
    severity_id = SEVERITY_ID[finding.severity]
    process = process_object(finding, hostname)
    container = container_object(finding)
    endpoint = dst_endpoint(finding)
    evidences = []
    # The full process rides on the first piece of evidence; the others point at it by pid and uid
    # (the same process in every item would multiply a record's size by its evidence count).
    process_ref = {k: process[k] for k in ("pid", "uid") if k in process} if process else None
    for item in finding.evidence or []:
        evidence: dict[str, Any] = {
            "data": {
                "rule_id": item.rule_id,
                "signal": item.signal,
                "description": item.description,
                "detail": item.detail,
                "weight": float(item.weight),  # as evidence_json writes it (40.0)
            }
        }
        if process is not None:
            evidence["process"] = process if not evidences else process_ref
        if container is not None:
            evidence["container"] = container
        if endpoint is not None and (item.rule_id.startswith("net-") or not evidences):
            evidence["dst_endpoint"] = endpoint  # the first item names it too: every record does
        if finding.kind == "host" and finding.subject and finding.subject.startswith("/"):
            evidence["file"] = _file_object(finding.subject, type_id=0)
        evidences.append(evidence)
    if not evidences:
        evidences.append(
            {"data": {"detail": finding.explanation}, **({"process": process} if process else {})}
        )
    activity_id, activity_name, status_id, status = ACTIVITIES.get(
        finding.activity, ACTIVITIES["create"]
    )
    resources: list[dict[str, Any]] = [{"type": "host", "name": hostname, "uid": hostname}]
    if container is not None:
        resources.append({"type": "container", "uid": container["uid"]})
    lifetime: dict[str, Any] = {}
    totals = finding.totals or {}
    if totals.get("started") and totals.get("ended"):
        lifetime = {
            "start_time": _ms(totals["started"]),
            "end_time": _ms(totals["ended"]),
            "duration": _ms(max(0.0, totals["ended"] - totals["started"])),
        }
    ended = finding.activity == "close" and finding.kind == "process"
    return {
        "class_uid": CLASS_UID,
        "class_name": CLASS_NAME,
        "category_uid": CATEGORY_UID,
        "category_name": CATEGORY_NAME,
        "activity_id": activity_id,
        "activity_name": activity_name,
        "type_uid": CLASS_UID * 100 + activity_id,
        "type_name": f"{CLASS_NAME}: {activity_name}",
        "time": _ms(created),
        "severity_id": severity_id,
        "severity": SEVERITY_NAME[severity_id],
        "status_id": status_id,
        "status": status,
        "risk_score": int(round(finding.score)),
        **({"status_detail": "process ended"} if ended else {}),
        **lifetime,
        "message": finding.explanation,
        "finding_info": {
            "uid": finding_uid(finding, hostname),
            "title": finding.rule_name,
            "desc": finding.rule_description,
            "types": [finding.kind, finding.verdict],
            "analytic": {
                "uid": finding.rule_id,
                "name": finding.rule_name,
                "type_id": ANALYTIC_RULE,
                "type": "Rule",
                **({"category": finding.rule_maturity} if finding.rule_maturity else {}),
            },
            "attacks": attacks(finding),
            "created_time": _ms(created),
        },
        **_remediation(finding),
        "evidences": evidences,
        "resources": resources,
        "device": {"hostname": hostname, "type_id": 0},
        # metadata.uid: the record's own id (ECS event.id), unique across agent restarts
        "metadata": {
            **metadata(container is not None),
            **({"uid": finding.record_id} if finding.record_id else {}),
        },
        "unmapped": {
            "gpuguard": {
                "score": round(float(finding.score), 1),
                **finding.score_cap_fields(),
                "verdict": finding.verdict,
                "kind": finding.kind,
                "rule_ids": finding.rule_ids,
                "subject": finding.subject,
                # OCSF 1.4's is_alert, kept here while the records declare 1.3
                "is_alert": finding.is_alert and finding.activity != "close",
                **({"host_gpu": finding.host_gpu} if finding.host_gpu is not None else {}),
                **({"response": finding.response} if finding.response else {}),
                **(
                    {"false_positives": list(finding.rule_content.false_positives)}
                    if finding.rule_content is not None and finding.rule_content.false_positives
                    else {}
                ),
                # OCSF's container.image needs the image's id, which the node's state does not give
                **(
                    {"container_image": finding.process.container_image}
                    if finding.process is not None and finding.process.container_image
                    else {}
                ),
                **(
                    {"kubernetes_unknown": finding.process.kubernetes_unknown}
                    if finding.process is not None and finding.process.kubernetes_unknown
                    else {}
                ),
                **_lifecycle_fields(finding),
                **(
                    {"evidence_omitted": finding.evidence_omitted}
                    if finding.evidence_omitted
                    else {}
                ),
            }
        },
    }


def _remediation(finding: Finding) -> dict[str, Any]:
    """OCSF ``remediation`` of a finding: its top rule's runbook and references."""
    content = finding.rule_content
    if content is None or not (content.runbook or content.references):
        return {}
    remediation: dict[str, Any] = {"desc": content.runbook or finding.rule_description}
    if content.references:
        remediation["references"] = [r.link for r in content.references]
    return {"remediation": remediation}


def _lifecycle_fields(finding: Finding) -> dict[str, Any]:
    """The agent's process-finding view OCSF 1.3 has no place for: record number, what grew,
    lifetime totals, every destination, the GPU use and the parent chain."""
    out: dict[str, Any] = {}
    fields = finding_fields(finding)
    if fields:
        out["finding"] = fields
    if finding.destinations:
        out["destinations"] = [d.to_json() for d in finding.destinations]
    if finding.gpu is not None:
        out["gpu"] = finding.gpu.to_json()
    return out


def action_to_ocsf(outcome: ActionOutcome, hostname: str) -> dict[str, Any]:
    """One OCSF Remediation Activity event (category 7) for a response action."""
    kind = kind_of(outcome.action)
    class_uid = kind.ocsf_class
    activity_id, activity_name = kind.ocsf_activity
    status_id, status = {"done": (1, "Success"), "failed": (2, "Failure")}.get(
        outcome.status, (99, "Other")
    )
    event: dict[str, Any] = {
        "class_uid": class_uid,
        "class_name": _OCSF_CLASS_NAME[class_uid],
        "category_uid": 7,
        "category_name": "Remediation",
        "activity_id": activity_id,
        "activity_name": activity_name,
        "type_uid": class_uid * 100 + activity_id,
        "type_name": f"{_OCSF_CLASS_NAME[class_uid]}: {activity_name}",
        "command_uid": command_uid(outcome, hostname),
        "time": _ms(outcome.time),
        "severity_id": 1,
        "severity": "Informational",
        "status_id": status_id,
        "status": status,
        "status_detail": f"{outcome.action} {outcome.status}",
        "message": outcome.reason or f"{outcome.action} {outcome.status}",
        "device": {"hostname": hostname, "type_id": 0},
        "metadata": metadata(),
        "unmapped": {
            "gpuguard": drop_empty(
                {
                    "action": outcome.action,
                    "status": outcome.status,
                    "verdict": outcome.verdict,
                    "score": outcome.score,
                    "rule_ids": list(outcome.rule_ids),
                    "block_id": outcome.block_id,
                    "expires": _ms(outcome.expires) if outcome.expires else None,
                    "detail": outcome.detail,
                }
            )
        },
    }
    process: dict[str, Any] = {}
    if outcome.pid:
        process = {
            "pid": outcome.pid,
            "name": outcome.comm,
            "uid": process_entity_id(hostname, outcome.pid, outcome.start_time),
        }
        if outcome.exe:
            process["file"] = _file_object(outcome.exe)
        if outcome.start_time:
            process["created_time"] = _ms(outcome.start_time)
    if class_uid == 7003:
        # The class requires the process; an action that lost its target names the pid it had.
        event["process"] = process or {"pid": outcome.pid}
    elif process:  # Remediation Activity (7001) and 7004 have no process attribute
        event["unmapped"]["gpuguard"]["process"] = process
    if class_uid == 7004:
        event["connection_info"] = {"direction_id": 2, "direction": "Outbound"}
    return event


def command_uid(outcome: ActionOutcome, hostname: str) -> str:
    """OCSF ``command_uid``: the block's id when the action left one, else a stable digest."""
    if outcome.block_id:
        return outcome.block_id
    key = f"{hostname}|{outcome.action}|{outcome.pid}|{outcome.start_time}|{outcome.time}"
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
    return f"gpuguard-{digest[:32]}"


def lifecycle_to_ocsf(record: AgentLifecycle, hostname: str) -> dict[str, Any]:
    """One OCSF Application Lifecycle event (6002) for the agent itself."""
    activity_id, activity_name = _LIFECYCLE_OCSF.get(record.action, (99, "Other"))
    failed = record.action in LIFECYCLE_FAILURES
    severity_id = {"high": 4, "medium": 3}.get(lifecycle_severity(record), 1)
    return {
        "class_uid": 6002,
        "class_name": "Application Lifecycle",
        "category_uid": 6,
        "category_name": "Application Activity",
        "activity_id": activity_id,
        "activity_name": activity_name,
        "type_uid": 6002 * 100 + activity_id,
        "type_name": f"Application Lifecycle: {activity_name}",
        "time": _ms(record.time),
        "severity_id": severity_id,
        "severity": {1: "Informational", 3: "Medium", 4: "High"}[severity_id],
        "status_id": 2 if failed else 1,
        "status": "Failure" if failed else "Success",
        "status_detail": record.action,
        "message": record.message or record.action,
        "app": {"name": "gpuguard", "vendor_name": "gpuguard", "version": __version__},
        "device": {"hostname": hostname, "type_id": 0},
        "metadata": metadata(),
        "unmapped": {"gpuguard": {"action": record.action, "detail": record.detail}},
    }


_OCSF_SKELETON = (
    "class_uid",
    "class_name",
    "category_uid",
    "category_name",
    "activity_id",
    "activity_name",
    "type_uid",
    "type_name",
    "command_uid",
    "time",
    "severity_id",
    "severity",
    "status_id",
    "status",
    "message",
    "risk_score",
    "finding_info.uid",
    "finding_info.title",
    "finding_info.analytic",
    "finding_info.created_time",
    "process.pid",
    "process.uid",
    "app",
    "connection_info",
    "device",
    "metadata.version",
    "metadata.profiles",
    "metadata.product",
)  # fmt: skip  (metadata.uid, the record id, does not fit the smallest budget: finding_info.uid does)

FORMAT = OutputFormat(
    name="ocsf",
    doc="OCSF 1.3 JSON: Detection Finding, Remediation and Application Lifecycle events",
    finding=lambda finding, created, to: finding_to_ocsf(finding, created, to.hostname),
    action=lambda outcome, to: action_to_ocsf(outcome, to.hostname),
    lifecycle=lambda record, to: lifecycle_to_ocsf(record, to.hostname),
    encode=json_encoder(("unmapped", "gpuguard"), _OCSF_SKELETON),
    mark_path=("unmapped", "gpuguard"),
    scan_option="ocsf",
    scan_help="OCSF Detection Finding",
    scan_schema={"name": "ocsf", "version": OCSF_VERSION, "class_uid": CLASS_UID},
)
