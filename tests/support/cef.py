"""A strict reader of the CEF lines the agent writes."""

from __future__ import annotations

import re


def parse_cef(line: str) -> tuple[list[str], dict[str, str]]:
    """A strict CEF reader: 7 header fields split on unescaped |, extension split on unescaped =."""
    assert line.startswith("CEF:0|")
    fields, current, i = [], "", 0
    while len(fields) < 7:
        ch = line[i]
        if ch == "\\":
            assert line[i + 1] in "\\|", f"bad header escape at {i}: {line[i : i + 2]!r}"
            current += line[i + 1]
            i += 2
            continue
        if ch == "|":
            fields.append(current)
            current = ""
        else:
            current += ch
        i += 1
    ext = line[i:]
    pairs = {}
    for match in re.finditer(r"(\w+)=((?:\\.|[^\\=])*?)(?= \w+=|$)", ext):
        value = re.sub(
            r"\\(.)", lambda m: {"n": "\n", "r": "\r"}.get(m.group(1), m.group(1)), match.group(2)
        )
        pairs[match.group(1)] = value
    return fields, pairs
