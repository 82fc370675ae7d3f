"""The agent's log records: one line per finding, action and lifecycle event, in ECS, OCSF or CEF.

Data flow: :class:`~gpuguard.outputs.finding.Finding` |
:class:`~gpuguard.events.agent_events.ActionOutcome` |
:class:`~gpuguard.events.agent_events.AgentLifecycle` -> :func:`render_record`
-> one line of text (no newline) that a log destination writes.

* **ECS** (default): findings reuse ``scan --json``'s mapping
  (:func:`~gpuguard.outputs.ecs.finding_to_ecs`, dataset ``gpuguard.agent``);
  actions are ``event.kind: "event"``, ``event.category: ["process"]`` (or
  ``["network"]`` for egress blocks), ``event.type`` from what the action did
  (each action's terms are its :class:`~gpuguard.events.action_kinds.ActionKind`),
  ``event.outcome`` success/failure/unknown; lifecycle records are
  ``event.category: ["configuration"|"process"]`` with ``event.action`` the
  lifecycle step.
* **OCSF**: findings are Detection Finding 2004; actions are Remediation
  classes (7003 Process Remediation, 7004 Network Remediation, 7001 for the
  rest) with the D3FEND activity (1 Isolate, 2 Evict, 3 Restore, 99 Other);
  lifecycle records are Application Lifecycle 6002 (3 Start, 4 Stop, 8 Update,
  99 Other).
  Remediation events carry the required ``command_uid``; 7001 and 7004 have no
  ``process``, so their target is in ``unmapped.gpuguard.process``.
* **CEF**: :mod:`gpuguard.outputs.cef`.

Every line is bounded (:mod:`gpuguard.outputs.bounds`): each string capped and
marked, the whole record within the destination's budget.

JSON encoding escapes every control character in structured fields, and
:func:`~gpuguard.outputs.jsonl.dumps_line` writes invalid UTF-8 as ``\\xNN``,
so one record is always exactly one line whatever a process calls itself.
"""

from __future__ import annotations

import hashlib
import socket
import time
from typing import Any

from gpuguard import __version__
from gpuguard.events.action_kinds import ACTION_KINDS, kind_of
from gpuguard.events.agent_events import ActionOutcome, AgentLifecycle
from gpuguard.outputs.bounds import OutputLimits, bound_evidence, fit_json, pick
from gpuguard.outputs.cef import cef_line
from gpuguard.outputs.ecs import ECS_VERSION, finding_to_ecs, host_fields, iso_time
from gpuguard.outputs.finding import Finding, process_entity_id
from gpuguard.outputs.jsonl import dumps_line
from gpuguard.outputs.ocsf import finding_to_ocsf, metadata

Record = Finding | ActionOutcome | AgentLifecycle
FORMATS = ("ecs", "ocsf", "cef")
DATASET = "gpuguard.agent"

# What each action does, in ECS event.type terms (test_output_schemas renders every one).
_ACTION_ECS_TYPE = {kind.name: kind.ecs_type for kind in ACTION_KINDS}
_OCSF_CLASS_NAME = {
    7001: "Remediation Activity",
    7003: "Process Remediation Activity",
    7004: "Network Remediation Activity",
}
_ACTION_OUTCOME = {"done": "success", "failed": "failure"}
_LIFECYCLE_OCSF = {
    "start": (3, "Start"),
    "stop": (4, "Stop"),
    "reload": (8, "Update"),
    "reload-failed": (8, "Update"),
}
_LIFECYCLE_FAILURES = ("reload-failed", "fault")
_LIFECYCLE_WARNINGS = ("drops", "degraded")


def _ms(epoch: float) -> int:
    return int(round(epoch * 1000))


def _clean(value: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in value.items() if v not in (None, "", [], {})}


def lifecycle_severity(record: AgentLifecycle) -> str:
    """ "high" for faults and failed reloads, "medium" for drops and degraded mode, else "informational"."""
    if record.action in _LIFECYCLE_FAILURES:
        return "high"
    if record.action in _LIFECYCLE_WARNINGS:
        return "medium"
    return "informational"


def action_to_ecs(outcome: ActionOutcome, host: dict[str, Any]) -> dict[str, Any]:
    """One ECS event for a response action and how it ended."""
    hostname = host.get("hostname", "")
    process = _clean(
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
            "category": [kind.ecs_category],
            "type": [kind.ecs_type],
            "action": outcome.action,
            "outcome": _ACTION_OUTCOME.get(outcome.status, "unknown"),
            "module": "gpuguard",
            "dataset": DATASET,
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
    doc["gpuguard"] = _clean(
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
        "stop": "end",
        "reload": "change",
        "reload-failed": "change",
    }.get(record.action, "info")
    outcome = "failure" if record.action in _LIFECYCLE_FAILURES else "success"
    return {
        "@timestamp": iso_time(record.time),
        "ecs": {"version": ECS_VERSION},
        "message": record.message or record.action,
        "event": {
            "kind": "event",
            "category": category,
            "type": [event_type],
            "action": record.action,
            "outcome": outcome,
            "module": "gpuguard",
            "dataset": DATASET,
            "created": iso_time(record.time),
        },
        "log": {
            "level": {"high": "error", "medium": "warning"}.get(lifecycle_severity(record), "info")
        },
        "host": host,
        "service": {"name": "gpuguard", "type": "gpuguard", "version": __version__},
        "gpuguard": _clean({"kind": "lifecycle", "action": record.action, "detail": record.detail}),
    }


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
            "gpuguard": _clean(
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
            process["file"] = {
                "path": outcome.exe,
                "name": outcome.exe.rsplit("/", 1)[-1],
                "type_id": 1,
            }
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
    failed = record.action in _LIFECYCLE_FAILURES
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


# The fields a record keeps when nothing else fits its budget (bounded by construction).
_ECS_SKELETON = (
    "@timestamp", "ecs.version", "message", "event.kind", "event.action", "event.category",
    "event.type", "event.outcome", "event.risk_score", "event.severity", "event.module",
    "event.dataset", "event.created", "rule.id", "rule.ruleset", "host.hostname", "host.name",
    "process.pid", "process.entity_id", "gpuguard.kind", "gpuguard.action", "gpuguard.status",
    "gpuguard.verdict", "gpuguard.score", "event.id", "event.sequence", "gpuguard.finding.id",
    "gpuguard.finding.sequence", "gpuguard.finding.activity",
)  # fmt: skip
_OCSF_SKELETON = (
    "class_uid", "class_name", "category_uid", "category_name", "activity_id", "activity_name",
    "type_uid", "type_name", "command_uid", "time", "severity_id", "severity", "status_id",
    "status", "message", "risk_score", "finding_info.uid", "finding_info.title",
    "finding_info.analytic", "finding_info.created_time", "process.pid", "process.uid", "app",
    "connection_info", "device", "metadata",
)  # fmt: skip


class RecordRenderer:
    """Renders records in one format for one host (host facts are read once), within ``limits``."""

    def __init__(
        self,
        fmt: str = "ecs",
        host: dict[str, Any] | None = None,
        limits: OutputLimits | None = None,
    ) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"unknown log format {fmt!r} (one of {', '.join(FORMATS)})")
        self.fmt = fmt
        self.host = host or host_fields()
        self.hostname = self.host.get("hostname") or socket.gethostname()
        self.limits = limits or OutputLimits()

    def document(self, record: Record) -> dict[str, Any]:
        """The ECS or OCSF object for ``record`` (exact values: no caps applied)."""
        if self.fmt == "ocsf":
            if isinstance(record, Finding):
                return finding_to_ocsf(record, _finding_time(record), self.hostname)
            if isinstance(record, ActionOutcome):
                return action_to_ocsf(record, self.hostname)
            if isinstance(record, AgentLifecycle):
                return lifecycle_to_ocsf(record, self.hostname)
        else:
            if isinstance(record, Finding):
                return finding_to_ecs(record, _finding_time(record), self.host, dataset=DATASET)
            if isinstance(record, ActionOutcome):
                return action_to_ecs(record, self.host)
            if isinstance(record, AgentLifecycle):
                return lifecycle_to_ecs(record, self.host)
        raise TypeError(f"not a log record: {type(record).__name__}")

    def line(self, record: Record) -> str:
        """One line of text (no trailing newline) of at most ``limits.record`` bytes."""
        if self.fmt == "cef":
            return cef_line(
                record,
                self.hostname,
                _finding_time(record) if isinstance(record, Finding) else None,
                self.limits,
            )

        def render(evidence: int) -> dict[str, Any]:
            if isinstance(record, Finding):
                return self.document(bound_evidence(record, evidence))
            return self.document(record)

        if self.fmt == "ocsf":
            mark_path: tuple[str, ...] = ("unmapped", "gpuguard")
            paths = _OCSF_SKELETON
        else:
            mark_path, paths = ("gpuguard",), _ECS_SKELETON
        count = len(record.evidence) if isinstance(record, Finding) else 0
        return fit_json(
            render, dumps_line, self.limits, mark_path, lambda doc: pick(doc, paths), count
        )


def _finding_time(finding: Finding) -> float:
    """When the finding was made (the verdict's time); a finding without one is "now"."""
    return finding.created if finding.created else time.time()


def render_record(
    record: Record,
    fmt: str = "ecs",
    host: dict[str, Any] | None = None,
    limits: OutputLimits | None = None,
) -> str:
    """One log line for ``record`` in ``fmt`` (``ecs``, ``ocsf`` or ``cef``), within ``limits``."""
    return RecordRenderer(fmt, host, limits).line(record)
