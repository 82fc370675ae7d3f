"""Escaping of attacker-controlled text before it reaches a terminal or log.

Process names, command lines, paths and payload bytes are chosen by whoever
runs the process.  Every string of that kind goes through :func:`escape_text`
before it is printed, so a name like ``"\\x1b]0;pwned\\x07"`` cannot move the
cursor, retitle the terminal or forge a log line.
"""

from __future__ import annotations

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\"}


def _escape_char(ch: str) -> str:
    named = _NAMED.get(ch)
    if named:
        return named
    code = ord(ch)
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not valid UTF-8 (surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def escape_text(value: object) -> str:
    """Return ``value`` as text that is safe to print on one terminal line.

    Every character Python does not call printable (C0/C1 controls, DEL, line
    separators, bidi overrides, zero-width formatting, lone surrogates) and the
    backslash itself are written as escapes, so the output is unambiguous.
    """
    text = value if isinstance(value, str) else str(value)
    if text.isprintable() and "\\" not in text:
        return text
    return "".join(ch if ch.isprintable() and ch != "\\" else _escape_char(ch) for ch in text)


def escape_bytes(data: bytes) -> str:
    """Render raw bytes as printable ASCII with ``\\xNN`` for everything else."""
    out = []
    for byte in data:
        if byte == 0x5C:
            out.append("\\\\")
        elif 0x20 <= byte < 0x7F:
            out.append(chr(byte))
        elif byte == 0x0A:
            out.append("\\n")
        elif byte == 0x0D:
            out.append("\\r")
        elif byte == 0x09:
            out.append("\\t")
        else:
            out.append(f"\\x{byte:02x}")
    return "".join(out)


def decode_c_string(raw: bytes) -> str:
    """Decode a NUL-terminated C buffer from the kernel without losing bytes.

    Invalid UTF-8 is kept as surrogate escapes so it still round-trips and is
    later shown as ``\\udcXX`` by :func:`escape_text`.
    """
    end = raw.find(b"\x00")
    if end >= 0:
        raw = raw[:end]
    return raw.decode("utf-8", "surrogateescape")


def json_safe_text(text: str) -> str:
    """``text`` with every lone surrogate written out, so it encodes as UTF-8.

    A byte that was not valid UTF-8 (``surrogateescape``, U+DC80..U+DCFF)
    becomes the text ``\\xNN``; any other lone surrogate the text ``\\uXXXX``.
    Everything else is kept exactly (JSON encoding escapes control characters).
    """
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    out = []
    for ch in text:
        code = ord(ch)
        if 0xDC80 <= code <= 0xDCFF:
            out.append(f"\\x{code - 0xDC00:02x}")
        elif 0xD800 <= code <= 0xDFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(ch)
    return "".join(out)


def visible_text(value: object, keep: str = "") -> str:
    """``value`` with every character :func:`escape_text` would escape shown as that escape,
    except the backslash itself and the characters in ``keep``, which stay as they are.

    For formats with an escaping rule of their own (CEF), which must apply it once: ESC
    becomes the text ``\\x1b`` and an invalid byte ``\\xff``, while ``\\`` (and, say, a
    newline the format can carry) is left for that format's escaping.
    """
    text = value if isinstance(value, str) else str(value)
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() or ch in keep else _escape_char(ch) for ch in text)
