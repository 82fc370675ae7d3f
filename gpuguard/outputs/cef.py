"""Records as ArcSight Common Event Format (CEF) lines, for ArcSight and Microsoft Sentinel over syslog.

``CEF:0|gpuguard|gpuguard|VERSION|SIGNATURE|NAME|SEVERITY|k=v k=v ...``

Escaping (CEF implementation standard): in the seven header fields ``\\`` and
``|`` are escaped with a backslash; in extension values ``\\``, ``=`` and
line breaks (``\\n``, ``\\r``).  Before that every value goes through
:func:`~gpuguard.escape.escape_text`, so ESC, other control characters and
invalid UTF-8 arrive as the visible text ``\\x1b`` rather than as raw bytes,
and a process name can never end the line or start a forged record.  What a
CEF parser decodes is therefore exactly what ``gpuguard`` prints on a
console.

Extension keys are CEF's standard dictionary names (``rt``, ``dvchost``,
``sproc``, ``spid``, ``suser``, ``suid``, ``filePath``, ``dst``/``dhost``,
``dpt``, ``act``, ``outcome``, ``cat``, ``msg``, ``externalId``) plus labelled
custom fields: ``cs1`` verdict, ``cs2`` rule ids, ``cs3`` ATT&CK techniques,
``cs4`` container id, ``cs5`` command line, ``cs6`` lifecycle/action detail,
``cn1`` score.
"""

from __future__ import annotations

import ipaddress
import json
import time
from typing import Any

from gpuguard import __version__
from gpuguard.escape import escape_text
from gpuguard.events.agent_events import ActionOutcome, AgentLifecycle
from gpuguard.outputs.finding import Finding

VENDOR = "gpuguard"
PRODUCT = "gpuguard"
_LIFECYCLE_SEVERITY = {"fault": 7, "reload-failed": 6, "drops": 5, "degraded": 5}


def header_escape(value: object) -> str:
    """A CEF header field: printable (see module docstring), with ``\\`` and ``|`` escaped."""
    return escape_text(value).replace("\\", "\\\\").replace("|", "\\|")


def extension_escape(value: object) -> str:
    """A CEF extension value: printable, with ``\\``, ``=`` and line breaks escaped."""
    text = escape_text(value).replace("\\", "\\\\").replace("=", "\\=")
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


def finding_cef(finding: Finding, hostname: str, created: float) -> str:
    p = finding.process
    pairs: list[tuple[str, object]] = [
        ("rt", int(created * 1000)),
        ("dvchost", hostname),
        ("cat", "/".join(finding.categories)),
        ("act", "resolved" if finding.activity == "close" else finding.action or "alert"),
        (
            "msg",
            f"resolved: {finding.explanation}"
            if finding.activity == "close"
            else finding.explanation,
        ),
        *_custom("cs1", "verdict", finding.verdict),
        *_custom("cs2", "rules", ",".join(finding.rule_ids)),
        *_custom("cs3", "techniques", ",".join(t for t, _ in finding.techniques)),
        *_custom("cn1", "score", int(round(finding.score))),
    ]
    if p is not None:
        pairs += [
            ("sproc", p.name),
            ("spid", p.pid),
            ("filePath", p.executable),
            ("suser", p.user_name),
            ("suid", p.user_id),
        ]
        pairs += _custom("cs4", "containerId", p.container_id)
        pairs += _custom("cs5", "commandLine", " ".join(p.command_line))
    elif finding.subject:
        pairs.append(("filePath", finding.subject))
    if finding.destinations:
        top = finding.destinations[0]
        pairs += [_endpoint(top.address), ("dpt", top.port)]
    name = finding.rule_description or finding.rule_name
    return f"{_header(finding.rule_id, name, round(finding.score / 10))}|{_extension(pairs)}"


def action_cef(outcome: ActionOutcome, hostname: str) -> str:
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
    return f"{_header('action-' + outcome.action, f'{outcome.action} {outcome.status}', severity)}|{_extension(pairs)}"


def lifecycle_cef(record: AgentLifecycle, hostname: str) -> str:
    pairs: list[tuple[str, object]] = [
        ("rt", int(record.time * 1000)),
        ("dvchost", hostname),
        ("act", record.action),
        ("msg", record.message),
        *_custom(
            "cs6",
            "detail",
            json.dumps(record.detail, sort_keys=True, default=str) if record.detail else None,
        ),
    ]
    severity = _LIFECYCLE_SEVERITY.get(record.action, 1)
    return f"{_header('agent-' + record.action, f'gpuguard {record.action}', severity)}|{_extension(pairs)}"


def cef_line(record: Any, hostname: str, created: float | None = None) -> str:
    """One CEF line (no newline) for a Finding, ActionOutcome or AgentLifecycle."""
    if isinstance(record, Finding):
        return finding_cef(record, hostname, created if created is not None else time.time())
    if isinstance(record, ActionOutcome):
        return action_cef(record, hostname)
    if isinstance(record, AgentLifecycle):
        return lifecycle_cef(record, hostname)
    raise TypeError(f"not a log record: {type(record).__name__}")
