"""A strict check of JSON output: valid UTF-8, a strict parse, no raw control bytes."""

from __future__ import annotations

import json


def assert_strict_json(text: str) -> object:
    """Valid UTF-8, parses with a strict parser, no raw control bytes anywhere."""
    raw = text.encode("utf-8")  # raises on any lone surrogate
    assert not any(b < 0x20 and b not in (0x0A,) for b in raw), "raw control byte in JSON"
    return json.loads(raw.decode("utf-8", "strict"))
