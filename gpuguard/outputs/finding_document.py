"""A finding as plain JSON: what hooks receive, and the state file's row of a recent finding.

Both render the one :class:`~gpuguard.outputs.finding.Finding` the log formats (ECS, OCSF,
CEF) render, so a field added to the finding reaches every output from there.  Strings are
raw here (JSON is the escaping); the state-file row escapes the process name, which
``gpuguard status`` prints.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from gpuguard.escape import escape_text
from gpuguard.outputs.finding import Finding, evidence_json, rule_content_json


def finding_document(finding: Finding) -> dict[str, Any]:
    """Every field of ``finding`` as JSON values (the ``finding`` key of a hook's document)."""
    content = rule_content_json(finding)
    return {
        "kind": finding.kind,
        "finding_id": finding.finding_id,
        "record_id": finding.record_id,
        "run_id": finding.run_id,
        "continued": finding.continued,
        "sequence": finding.sequence,
        "activity": finding.activity,
        "created": finding.created,
        "rule_id": finding.rule_id,
        "rule_ids": finding.rule_ids,
        "rule_name": finding.rule_name,
        "rule_description": finding.rule_description,
        "score": finding.score,
        "score_capped": finding.score_cap is not None,
        "score_cap": finding.score_cap.to_json() if finding.score_cap is not None else None,
        "severity": finding.severity,
        "verdict": finding.verdict,
        "categories": list(finding.categories),
        "techniques": [{"id": t, "name": name} for t, name in finding.techniques],
        "explanation": finding.explanation,
        "evidence": [evidence_json(e) for e in finding.evidence],
        "process": asdict(finding.process) if finding.process is not None else None,
        "subject": finding.subject,
        "allowlisted": finding.allowlisted,
        "action": finding.action,
        "destinations": [d.to_json() for d in finding.destinations],
        "gpu": finding.gpu.to_json() if finding.gpu is not None else None,
        "host_gpu": finding.host_gpu,
        "changes": list(finding.changes),
        "totals": finding.totals,
        "response": finding.response,
        "rule_maturity": finding.rule_maturity,
        "rule_content": {k: v for k, v in content.items() if k != "maturity"} if content else None,
    }


def status_row(finding: Finding, found: float) -> dict[str, Any]:
    """The state file's ``last_findings`` row of a process finding raised at ``found``."""
    process = finding.process
    return {
        "time": found,
        "pid": process.pid if process is not None else None,
        "start_time": process.start_time if process is not None else None,
        "comm": escape_text(process.name) if process is not None else "",
        "verdict": finding.verdict,
        "score": int(finding.score),
        "rule_ids": finding.rule_ids,
        "allowlisted": finding.allowlisted,
    }
