"""Every JSON gpuguard writes (watch/replay lines, gpus, scan documents): one escaping rule.

Details: docs/internals.md, "jsonl".
"""

from __future__ import annotations

import json
import math
from typing import Any

from gpuguard.escape import json_safe_text

# Characters a JSON encoder may emit raw that some line readers treat as line breaks or controls.
_LINE_BREAKERS = {code: f"\\u{code:04x}" for code in (*range(0x7F, 0xA0), 0x2028, 0x2029)}


def _clean(value: Any) -> Any:
    if isinstance(value, str):
        return json_safe_text(value)
    if isinstance(value, dict):
        return {
            json_safe_text(k if isinstance(k, str) else str(k)): _clean(v) for k, v in value.items()
        }
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_clean(v) for v in value]
    if isinstance(value, (bytes, bytearray)):
        return json_safe_text(bytes(value).decode("utf-8", "surrogateescape"))
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return json_safe_text(str(value))


def _valid(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def _dumps(obj: Any, indent: int | None) -> str:
    separators = (",", ":") if indent is None else (",", ": ")
    try:
        text = json.dumps(
            obj, ensure_ascii=False, separators=separators, indent=indent, allow_nan=False
        )
        if not _valid(text):
            text = json.dumps(
                _clean(obj),
                ensure_ascii=False,
                separators=separators,
                indent=indent,
                allow_nan=False,
            )
    except (TypeError, ValueError):
        text = json.dumps(
            _clean(obj), ensure_ascii=False, separators=separators, indent=indent, allow_nan=False
        )
    return text if text.isascii() else text.translate(_LINE_BREAKERS)


def dumps_line(obj: Any) -> str:
    """One JSON object on one line (no trailing newline), valid UTF-8 whatever ``obj`` holds."""
    return _dumps(obj, None)


def dumps_document(obj: Any, indent: int = 2) -> str:
    """One indented JSON document (``scan --json``), under the same rule as :func:`dumps_line`."""
    return _dumps(obj, indent)
