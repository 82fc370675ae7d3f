"""JSON lines for machines (SIEMs, jq): one compact object per line, always valid UTF-8.

Kernel strings are decoded with ``surrogateescape`` so no byte is lost; here
any such byte is written as the text ``\\xNN`` so the line stays valid JSON
that every parser accepts.  Control characters are escaped by JSON itself;
the line breaks JSON leaves alone (C1 controls such as NEL, U+2028 and
U+2029, which some readers split lines on) are written as ``\\uXXXX`` too,
so one object is one line for every reader.
"""

from __future__ import annotations

import json
from typing import Any

# Characters a JSON encoder may emit raw that some line readers treat as line breaks or controls.
_LINE_BREAKERS = {code: f"\\u{code:04x}" for code in (*range(0x7F, 0xA0), 0x2028, 0x2029)}


def _clean(value: Any) -> Any:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:
            return value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    if isinstance(value, dict):
        return {str(_clean(k)): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    return value


def dumps_line(obj: dict[str, Any]) -> str:
    """One JSON object on one line (no trailing newline)."""
    try:
        line = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        line.encode("utf-8")   # json.dumps keeps lone surrogates (undecodable bytes) as they are
    except (UnicodeEncodeError, TypeError, ValueError):
        line = json.dumps(_clean(obj), ensure_ascii=False, separators=(",", ":"), default=str)
    return line.translate(_LINE_BREAKERS)
