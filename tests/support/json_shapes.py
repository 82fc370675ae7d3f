"""The documented JSON shape of a finding and a scan document (docs/scan.md), and a checker."""

from __future__ import annotations

from typing import Any

# ---- the documented JSON shape (docs/scan.md "JSON output") ----------------------
# A JSON-schema-like description: "type" is a Python type or tuple; "required"
# lists keys; "properties" describes nested objects; "items" describes list items.

_STR, _INT, _NUM, _BOOL = str, int, (int, float), bool
_STRS = {"type": list, "items": {"type": _STR}}

ECS_FINDING_SHAPE: dict[str, Any] = {
    "type": dict,
    "required": ["@timestamp", "ecs", "message", "event", "rule", "threat", "host", "gpuguard"],
    "properties": {
        "@timestamp": {"type": _STR},
        "ecs": {"type": dict, "required": ["version"]},
        "message": {"type": _STR},
        "event": {
            "type": dict,
            "required": ["kind", "category", "type", "risk_score", "severity", "module", "dataset"],
            "properties": {
                "kind": {"type": _STR, "enum": ["alert", "event"]},
                "category": _STRS,
                "type": _STRS,
                "risk_score": {"type": _NUM},
                "severity": {"type": _INT},
            },
        },
        "rule": {
            "type": dict,
            "required": ["id", "name", "description"],
            "properties": {
                "id": {"type": _STR},
                "name": {"type": _STR},
                "description": {"type": _STR},
            },
        },
        "threat": {
            "type": dict,
            "required": ["framework", "technique"],
            "properties": {
                "framework": {"type": _STR, "enum": ["MITRE ATT&CK"]},
                "technique": {
                    "type": dict,
                    "required": ["id", "name"],
                    "properties": {"id": _STRS, "name": _STRS},
                },
            },
        },
        "process": {
            "type": dict,
            "required": ["pid"],
            "properties": {
                "pid": {"type": _INT},
                "name": {"type": _STR},
                "executable": {"type": _STR},
                "command_line": {"type": _STR},
                "args": _STRS,
                "parent": {"type": dict, "properties": {"pid": {"type": _INT}}},
            },
        },
        "user": {"type": dict, "properties": {"id": {"type": _STR}, "name": {"type": _STR}}},
        "container": {"type": dict, "required": ["id"]},
        "orchestrator": {"type": dict, "required": ["type", "resource"]},
        "gpuguard": {
            "type": dict,
            "required": ["kind", "score", "verdict", "severity", "rule_ids", "evidence"],
            "properties": {
                "kind": {"type": _STR, "enum": ["process", "host"]},
                "score": {"type": _NUM},
                "verdict": {"type": _STR, "enum": ["clean", "suspicious", "malicious"]},
                "rule_ids": _STRS,
                "evidence": {
                    "type": list,
                    "items": {
                        "type": dict,
                        "required": ["rule_id", "detail", "weight"],
                        "properties": {
                            "rule_id": {"type": _STR},
                            "detail": {"type": _STR},
                            "weight": {"type": _NUM},
                        },
                    },
                },
            },
        },
    },
}

OCSF_FINDING_SHAPE: dict[str, Any] = {
    "type": dict,
    "required": [
        "class_uid",
        "category_uid",
        "activity_id",
        "type_uid",
        "severity_id",
        "time",
        "finding_info",
        "metadata",
        "evidences",
    ],
    "properties": {
        "class_uid": {"type": _INT, "enum": [2004]},
        "category_uid": {"type": _INT, "enum": [2]},
        "activity_id": {"type": _INT, "enum": [1]},
        "type_uid": {"type": _INT, "enum": [200401]},
        "severity_id": {"type": _INT, "enum": [1, 2, 3, 4, 5]},
        "time": {"type": _INT},
        "finding_info": {
            "type": dict,
            "required": ["uid", "title", "analytic"],
            "properties": {
                "uid": {"type": _STR},
                "title": {"type": _STR},
                "types": _STRS,
                "analytic": {"type": dict, "required": ["type_id"]},
            },
        },
        "metadata": {
            "type": dict,
            "required": ["product", "version"],
            "properties": {"product": {"type": dict, "required": ["name", "version"]}},
        },
        "evidences": {"type": list, "items": {"type": dict}},
    },
}

SCAN_DOCUMENT_SHAPE: dict[str, Any] = {
    "type": dict,
    "required": ["scanner", "host", "summary", "findings"],
    "properties": {
        "scanner": {
            "type": dict,
            "required": ["name", "version", "command", "started", "finished", "schema"],
        },
        "host": {"type": dict, "required": ["hostname"]},
        "summary": {
            "type": dict,
            "required": [
                "processes_scanned",
                "findings",
                "malicious",
                "suspicious",
                "highest_score",
                "exit_code",
                "could_not_see",
                "gpu_stack",
            ],
            "properties": {
                "processes_scanned": {"type": _INT},
                "exit_code": {"type": _INT, "enum": [0, 1]},
                "could_not_see": _STRS,
            },
        },
        "findings": {"type": list},
    },
}


def shape_errors(value: Any, shape: dict[str, Any], where: str = "$") -> list[str]:
    """Every place ``value`` departs from ``shape`` (empty when it conforms)."""
    errors: list[str] = []
    expected = shape.get("type")
    if expected is not None:
        # bool is an int in Python; a number field must not accept True.
        if (
            isinstance(value, bool)
            and expected is not bool
            and (expected is int or (isinstance(expected, tuple) and bool not in expected))
        ):
            return [f"{where}: expected {expected}, got bool"]
        if not isinstance(value, expected):
            return [f"{where}: expected {expected}, got {type(value).__name__}"]
    if "enum" in shape and value not in shape["enum"]:
        errors.append(f"{where}: {value!r} not in {shape['enum']}")
    if isinstance(value, dict):
        for key in shape.get("required", ()):
            if key not in value:
                errors.append(f"{where}: missing {key!r}")
        for key, sub in shape.get("properties", {}).items():
            if key in value:
                errors.extend(shape_errors(value[key], sub, f"{where}.{key}"))
    if isinstance(value, list) and "items" in shape:
        for i, item in enumerate(value):
            errors.extend(shape_errors(item, shape["items"], f"{where}[{i}]"))
    return errors
