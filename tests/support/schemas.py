"""Schema checks for log records: OCSF (the validator of the declared version), ECS (Elastic's field
list), CEF (a strict parser); every record an agent test writes goes through them."""

from __future__ import annotations

import ipaddress
import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
from ocsf_json_schema import OcsfJsonSchemaEmbedded, get_ocsf_schema

from gpuguard.outputs.ocsf import OCSF_VERSION

ECS_FIELDS = Path(__file__).resolve().parent.parent / "data" / "ecs_flat_8.11.json"


@cache
def _ocsf() -> OcsfJsonSchemaEmbedded:
    return OcsfJsonSchemaEmbedded(get_ocsf_schema(version=OCSF_VERSION))


@cache
def _validator(class_uid: int, profiles: tuple[str, ...]) -> jsonschema.Draft202012Validator:
    schema = _ocsf().get_class_schema(_ocsf().lookup_class_name_from_uid(class_uid), list(profiles))
    return jsonschema.Draft202012Validator(schema)


def ocsf_errors(event: dict[str, Any]) -> list[str]:
    """What the OCSF schema of the version ``event`` declares finds wrong with it."""
    meta = event.get("metadata", {})
    if meta.get("version") != OCSF_VERSION:
        return [f"declares {meta.get('version')!r}, not {OCSF_VERSION}"]
    validator = _validator(event["class_uid"], tuple(meta.get("profiles", ())))
    return [
        f"{'/'.join(str(p) for p in e.absolute_path)}: {e.message[:200]}"
        for e in validator.iter_errors(event)
    ]


# -- ECS --------------------------------------------------------------------------------------
@cache
def ecs_fields() -> dict[str, dict[str, Any]]:
    return json.loads(ECS_FIELDS.read_text())["fields"]


_TEXT = ("keyword", "wildcard", "match_only_text", "text", "constant_keyword")
_INTEGER = ("long", "integer", "short", "byte", "unsigned_long")
_FLOAT = ("float", "double", "half_float", "scaled_float")
_ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")


def _type_ok(kind: str, value: Any) -> bool:
    if kind in _TEXT:
        return isinstance(value, str)
    if kind in _INTEGER:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind in _FLOAT:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "date":
        return isinstance(value, str) and bool(_ISO.match(value))
    if kind == "ip":
        try:
            ipaddress.ip_address(value)
            return True
        except ValueError:
            return False
    if kind == "boolean":
        return isinstance(value, bool)
    if kind in ("object", "flattened", "nested"):
        return isinstance(value, (dict, list))
    return False


def ecs_pair_errors(doc: dict[str, Any]) -> list[str]:
    """``event.type`` values that ECS's ``expected_event_types`` does not expect under one of the
    record's ``event.category`` values (every type under every category, as Kibana checks it);
    values ECS does not know at all are reported by :func:`ecs_errors` instead."""
    event = doc.get("event") if isinstance(doc.get("event"), dict) else {}
    fields = ecs_fields()
    expected = fields["event.category"]["expected_event_types"]
    known = fields["event.type"]["allowed"]
    listed = [v if isinstance(v, list) else [v] for v in (event.get("category"), event.get("type"))]
    categories, types = ([x for x in values if x is not None] for values in listed)
    return [
        f"event.type {kind!r} is not expected under event.category {category!r}"
        for category in categories
        if category in expected
        for kind in types
        if kind in known and kind not in expected[category]
    ]


def ecs_errors(doc: dict[str, Any], path: str = "") -> list[str]:
    """Fields of ``doc`` outside ECS (``gpuguard.*`` is ours) or of the wrong type or value, and
    category/type pairs ECS does not expect."""
    errors: list[str] = [] if path else ecs_pair_errors(doc)
    fields = ecs_fields()
    for key, value in doc.items():
        name = f"{path}{key}"
        if name == "gpuguard":
            continue
        spec = fields.get(name)
        if spec is None:
            if isinstance(value, dict):
                errors += ecs_errors(value, name + ".")
            else:
                errors.append(f"{name}: not an ECS field")
            continue
        if spec["type"] in ("object", "flattened", "nested"):
            continue
        values = value if isinstance(value, list) else [value]
        if isinstance(value, list) and not spec.get("array"):
            errors.append(f"{name}: a list where ECS expects one value")
        if spec.get("array") and not isinstance(value, list):
            errors.append(f"{name}: ECS expects an array")
        for item in values:
            if not _type_ok(spec["type"], item):
                errors.append(f"{name}: {item!r} is not {spec['type']}")
            elif "allowed" in spec and item not in spec["allowed"]:
                errors.append(f"{name}: {item!r} is not one of ECS's values")
    return errors


# -- CEF --------------------------------------------------------------------------------------
_KEY = re.compile(r"[A-Za-z0-9_]+")


def strict_cef(line: str) -> tuple[list[str], dict[str, str]]:
    """Parse a CEF line by the ArcSight rules, refusing anything they do not allow.

    Header (7 fields): ``\\`` escapes only ``\\`` and ``|``.  Extension: ``key=value``
    pairs separated by spaces; in a value ``\\`` escapes only ``\\``, ``=``, ``n`` and ``r``
    (the last two decode to line breaks); an unescaped ``=`` ends the value before the
    last space (it starts the next key).  The line holds no raw line break.
    """
    assert "\n" not in line and "\r" not in line
    header: list[str] = []
    current: list[str] = []
    i = 0
    while len(header) < 7:
        ch = line[i]
        if ch == "\\":
            nxt = line[i + 1]
            if nxt not in "\\|":
                raise ValueError(f"bad header escape \\{nxt} at {i}")
            current.append(nxt)
            i += 2
            continue
        if ch == "|":
            header.append("".join(current))
            current = []
        else:
            current.append(ch)
        i += 1
    if header[0] != "CEF:0":
        raise ValueError("not CEF:0")
    ext = line[i:]
    # Split on every unescaped '=': each piece but the last ends with " KEY".
    pieces: list[str] = []
    start = j = 0
    while j < len(ext):
        if ext[j] == "\\":
            j += 2
            continue
        if ext[j] == "=":
            pieces.append(ext[start:j])
            start = j + 1
        j += 1
    pieces.append(ext[start:])
    pairs: dict[str, str] = {}
    key = pieces[0]
    for n, piece in enumerate(pieces[1:], 1):
        if not _KEY.fullmatch(key):
            raise ValueError(f"bad key {key!r}")
        if n < len(pieces) - 1:
            raw, sep, next_key = piece.rpartition(" ")
            if not sep:
                raise ValueError(f"unescaped '=' inside the value of {key}")
        else:
            raw, next_key = piece, ""
        value: list[str] = []
        k = 0
        while k < len(raw):
            if raw[k] == "\\":
                esc = raw[k + 1 : k + 2]
                if esc not in ("\\", "=", "n", "r"):
                    raise ValueError(f"bad extension escape \\{esc} in {key}")
                value.append({"n": "\n", "r": "\r"}.get(esc, esc))
                k += 2
            else:
                value.append(raw[k])
                k += 1
        if key in pairs:
            raise ValueError(f"key {key} twice")
        pairs[key] = "".join(value)
        key = next_key
    return header, pairs


def record_errors(line: str) -> list[str]:
    """What is wrong with one log line, by the format it is in (CEF, OCSF or ECS JSON)."""
    if line.startswith("CEF:") or line.startswith("<") and " CEF:" in line[:400]:
        try:
            strict_cef(line[line.index("CEF:") :])
        except (ValueError, IndexError, AssertionError) as exc:
            return [f"CEF: {exc}"]
        return []
    try:
        doc = json.loads(line)
    except ValueError as exc:
        return [f"not JSON: {exc}"]
    if not isinstance(doc, dict):
        return ["not a JSON object"]
    if "class_uid" in doc:
        return ocsf_errors(doc)
    if "ecs" in doc:
        return ecs_errors(doc)
    return ["neither ECS, OCSF nor CEF"]


def log_errors(path: Path, limit: int = 5) -> list[str]:
    """The first ``limit`` problems of the log file at ``path``, each as ``line N: problem``."""
    problems: list[str] = []
    try:
        text = path.read_text(errors="surrogateescape")
    except FileNotFoundError:
        return []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            problems += [f"line {number}: {p}" for p in record_errors(line)]
        if len(problems) >= limit:
            break
    return problems[:limit]
