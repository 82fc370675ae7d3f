"""Records as ArcSight Common Event Format (CEF) lines, for ArcSight and Microsoft Sentinel (syslog).

``CEF:0|gpuguard|gpuguard|VERSION|SIGNATURE|NAME|SEVERITY|k=v k=v ...``

Details: docs/internals.md, "cef".
"""

from __future__ import annotations

import ipaddress
import json
from typing import Any

from gpuguard import __version__
from gpuguard.escape import visible_text
from gpuguard.events.agent_events import ActionOutcome, AgentLifecycle
from gpuguard.outputs.bounds import OutputLimits, cap_text, raw_bytes, text_mark
from gpuguard.outputs.finding import Finding, rule_content_json
from gpuguard.outputs.output_format import LIFECYCLE_FAILURES, OutputFormat

VENDOR = "gpuguard"
PRODUCT = "gpuguard"
_LIFECYCLE_SEVERITY = {"start-failed": 7, "fault": 7, "reload-failed": 6, "drops": 5, "degraded": 5}
# Lengths the CEF dictionary gives its keys (characters); a value is never capped above these.
_SPEC_LENGTH = {
    "msg": 1023, "sproc": 1023, "filePath": 1023, "suser": 1023, "dhost": 1023, "cat": 1023,
    "act": 63, "outcome": 63, "externalId": 40, "fileHash": 255,
    **{f"cs{i}": 4000 for i in range(1, 7)},
}  # fmt: skip
_CMDLINE_KEYS = ("cs5", "cs6", "msg")
_HEADER_BYTES = 512  # signature and name (rule ids and descriptions)
_FLOOR_BYTES = 64  # as in outputs/bounds.py: ids and host names stay whole
MARK_KEY = "flexString1"


def header_escape(value: object) -> str:
    """A CEF header field: visible text (see module docstring), with ``\\`` and ``|`` escaped."""
    return visible_text(value).replace("\\", "\\\\").replace("|", "\\|")


def extension_escape(value: object) -> str:
    """A CEF extension value: visible text, with ``\\``, ``=`` and line breaks escaped."""
    text = visible_text(value, keep="\n\r").replace("\\", "\\\\").replace("=", "\\=")
    return text.replace("\n", "\\n").replace("\r", "\\r")


def _present(value: object) -> bool:
    return value is not None and value != "" and value != []


def _extension(pairs: list[tuple[str, object]]) -> str:
    return " ".join(f"{key}={extension_escape(value)}" for key, value in pairs if _present(value))


def _custom(key: str, label: str, value: object) -> list[tuple[str, object]]:
    """A labelled custom field (``cs1Label=verdict cs1=...``), or nothing when there is no value."""
    return [(f"{key}Label", label), (key, value)] if _present(value) else []


def _endpoint(address: str) -> tuple[str, str]:
    """``("dst", ip)`` for an IP address, ``("dhost", name)`` otherwise."""
    try:
        return "dst", str(ipaddress.ip_address(address))
    except ValueError:
        return "dhost", address


def _header(signature: str, name: str, severity: int) -> str:
    fields = [
        "CEF:0",
        VENDOR,
        PRODUCT,
        __version__,
        signature,
        name,
        str(max(0, min(10, severity))),
    ]
    return "|".join([fields[0]] + [header_escape(f) for f in fields[1:]])


Parts = tuple[str, str, int, list[tuple[str, object]]]  # signature, name, severity, extension


def finding_cef(finding: Finding, hostname: str, created: float) -> Parts:
    p = finding.process
    closed = finding.activity == "close"
    end_word = "ended" if finding.kind == "process" else "resolved"
    act = end_word if closed else finding.action or "alert"
    if finding.activity == "update":
        act = "update"
    pairs: list[tuple[str, object]] = [
        ("rt", int(created * 1000)),
        ("dvchost", hostname),
        ("cat", "/".join(finding.categories)),
        ("act", act),
        ("msg", f"{end_word}: {finding.explanation}" if closed else finding.explanation),
        ("externalId", finding.finding_id),
        *_custom("cs1", "verdict", finding.verdict),
        *_custom("cs2", "rules", ",".join(finding.rule_ids)),
        *_custom("cs3", "techniques", ",".join(t for t, _ in finding.techniques)),
        *_custom("cn1", "score", int(round(finding.score))),
        *_score_cap(finding),
    ]
    if p is not None:
        pairs += [
            ("sproc", p.name),
            ("spid", p.pid),
            ("filePath", p.executable),
            ("suser", p.user_name),
            ("suid", p.user_id),
        ]
        pairs += [("fileHash", p.exe_sha256)]
        pairs += _custom("cs4", "containerId", p.container_id)
        pairs += _custom("cs5", "commandLine", " ".join(p.command_line))
    elif finding.subject:
        pairs.append(("filePath", finding.subject))
    if finding.destinations:
        top = finding.destinations[0]
        pairs += [_endpoint(top.address), ("dpt", top.port)]
        if top.domain and _endpoint(top.address)[0] == "dst":
            pairs.append(("dhost", top.domain))
    pairs += _custom("cs6", "finding", _finding_detail(finding))
    content = rule_content_json(finding)
    if content is not None:  # the top rule's tier, false positives, references and runbook
        text = json.dumps(content, sort_keys=True, separators=(",", ":"))
        pairs += _custom("flexString2", "rule", text)
    name = finding.rule_description or finding.rule_name
    return finding.rule_id, name, round(finding.score / 10), pairs


def _score_cap(finding: Finding) -> list[tuple[str, object]]:
    """cn2 (process findings): whether the score was capped; cn3: the sum before the cap (the
    reason is in ``msg``, the explanation)."""
    fields = finding.score_cap_fields()
    if not fields:
        return []
    cap = finding.score_cap
    return [
        *_custom("cn2", "scoreCapped", int(fields["score_capped"])),
        *(_custom("cn3", "uncappedScore", cap.uncapped) if cap is not None else []),
    ]


def _finding_detail(finding: Finding) -> str | None:
    """cs6 of a process finding: its record number, what grew, totals, GPU use, parent chain."""
    if not finding.finding_id:
        return None
    detail: dict[str, Any] = {"sequence": finding.sequence, "activity": finding.activity}
    if finding.run_id:
        detail["record_id"] = finding.record_id
    if finding.continued:
        detail["continued"] = True
    if finding.changes:
        detail["changes"] = finding.changes
    if finding.totals:
        detail["totals"] = finding.totals
    if finding.gpu is not None:
        gpu = finding.gpu.to_json()
        detail["gpu"] = {
            k: gpu[k] for k in ("device_paths", "memory_used", "memory_share") if k in gpu
        }
    if finding.response:
        detail["response"] = finding.response
    if finding.process is not None and finding.process.pod_name:
        detail["pod"] = f"{finding.process.pod_namespace or ''}/{finding.process.pod_name}"
    if finding.process is not None and finding.process.container_image:
        detail["image"] = finding.process.container_image
    if finding.process is not None and finding.process.kubernetes_unknown:
        detail["kubernetes_unknown"] = finding.process.kubernetes_unknown
    if finding.process is not None and finding.process.ancestors:
        detail["parents"] = [
            [a.get("pid"), a.get("name"), a.get("executable")] for a in finding.process.ancestors
        ]
    return json.dumps(detail, sort_keys=True, separators=(",", ":"), default=str)


def action_cef(outcome: ActionOutcome, hostname: str) -> Parts:
    severity = 8 if outcome.status == "failed" else round(outcome.score / 10)
    pairs: list[tuple[str, object]] = [
        ("rt", int(outcome.time * 1000)),
        ("dvchost", hostname),
        ("act", outcome.action),
        ("outcome", outcome.status),
        ("msg", outcome.reason),
        ("externalId", outcome.block_id),
        ("sproc", outcome.comm),
        ("spid", outcome.pid or None),
        ("filePath", outcome.exe),
        *_custom("cs1", "verdict", outcome.verdict),
        *_custom("cs2", "rules", ",".join(outcome.rule_ids)),
        *_custom(
            "cs6",
            "detail",
            json.dumps(outcome.detail, sort_keys=True, default=str) if outcome.detail else None,
        ),
        *_custom("cn1", "score", outcome.score),
    ]
    return "action-" + outcome.action, f"{outcome.action} {outcome.status}", severity, pairs


def lifecycle_cef(record: AgentLifecycle, hostname: str) -> Parts:
    pairs: list[tuple[str, object]] = [
        ("rt", int(record.time * 1000)),
        ("dvchost", hostname),
        ("act", record.action),
        ("outcome", "failure" if record.action in LIFECYCLE_FAILURES else "success"),
        ("msg", record.message),
        *_custom(
            "cs6",
            "detail",
            json.dumps(record.detail, sort_keys=True, default=str) if record.detail else None,
        ),
    ]
    severity = _LIFECYCLE_SEVERITY.get(record.action, 1)
    return "agent-" + record.action, f"gpuguard {record.action}", severity, pairs


def _cap(key: str, value: object, cmdline: int, name: int, marks: dict[str, Any]) -> object:
    """One extension value cut to its cap (in bytes of the visible text), marked when cut."""
    if not isinstance(value, str):
        return value
    limit = min(cmdline if key in _CMDLINE_KEYS else name, _SPEC_LENGTH.get(key, 1 << 30))
    # Visible text is never shorter than the value: its first limit+1 characters decide the cut.
    shown = visible_text(value[: limit + 1], keep="\n\r")
    capped, mark = cap_text(shown, limit)
    if mark is not None:
        marks[key] = text_mark(raw_bytes(value))
    return capped


def bounded_line(parts: Parts, limits: OutputLimits) -> str:
    """The CEF line of ``parts`` with every value capped, within ``limits.record`` bytes."""
    signature, name, severity, pairs = parts
    header = _header(
        cap_text(visible_text(signature), _HEADER_BYTES)[0],
        cap_text(visible_text(name), _HEADER_BYTES)[0],
        severity,
    )
    cmdline, name_cap = limits.cmdline, limits.name
    shed: list[str] = []
    while True:
        marks: dict[str, Any] = {}
        capped = [(key, _cap(key, value, cmdline, name_cap, marks)) for key, value in pairs]
        mark_doc: dict[str, Any] = dict(marks)
        if shed:
            mark_doc["shed"] = shed
        if mark_doc:
            capped += _custom(MARK_KEY, "truncated", json.dumps(mark_doc, separators=(",", ":")))
        line = f"{header}|{_extension(capped)}"
        if len(line.encode("utf-8")) <= limits.record:
            return line
        if max(cmdline, name_cap) <= _FLOOR_BYTES:
            break
        cmdline, name_cap = max(_FLOOR_BYTES, cmdline // 2), max(_FLOOR_BYTES, name_cap // 2)
        shed = ["strings"]
    # Last resort: the fixed fields alone.
    fixed = ("rt", "dvchost", "act", "outcome", "spid", "cn1", "externalId")  # externalId: <= 40
    keep = [(k, v) for k, v in pairs if k in fixed]
    mark_doc = {"record": text_mark(line.encode("utf-8")), "shed": ["strings", "fields"]}
    keep += _custom(MARK_KEY, "truncated", json.dumps(mark_doc, separators=(",", ":")))
    return f"{header}|{_extension(keep)}"


FORMAT = OutputFormat(
    name="cef",
    doc="ArcSight Common Event Format lines (ArcSight, Microsoft Sentinel over syslog)",
    finding=lambda finding, created, to: finding_cef(finding, to.hostname, created),
    action=lambda outcome, to: action_cef(outcome, to.hostname),
    lifecycle=lambda record, to: lifecycle_cef(record, to.hostname),
    encode=lambda render, evidence, limits: bounded_line(render(evidence), limits),
)
