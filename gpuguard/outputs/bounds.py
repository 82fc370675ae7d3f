"""Size bounds on log records: each field capped and marked, each record within one budget.

A process picks its own name, path and command line, so every string a log
record carries is capped (:class:`OutputLimits`: command lines 4 KiB, each
argument 1 KiB, names, paths and any other text 1 KiB, counted in bytes of the
raw value).  A capped value keeps its first bytes and is *marked*: the record
says which field was cut, how long the original was (bytes) and the original's
SHA-256, so an analyst can match it against ``/proc/PID/cmdline`` or a file
on disk.  ``process.args`` is capped per argument and in total (the command
line's cap); its mark also gives the original argument count, and its length
and digest are those of the arguments joined by NUL (``/proc/PID/cmdline``
without the final NUL).

Details: docs/internals.md, "bounds".
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuguard.outputs.finding import Finding

DEFAULT_CMDLINE_BYTES = 4096
DEFAULT_ARG_BYTES = 1024
DEFAULT_NAME_BYTES = 1024
DEFAULT_RECORD_BYTES = 7680
DEFAULT_EVIDENCE = 10
MAX_LIST_ITEMS = 64  # any other list (addresses in an action's detail, device paths)
_FLOOR_BYTES = 64  # strings are never shed below this (a timestamp, an id, a sha256 stay whole)
_CMDLINE_LEAVES = ("command_line", "cmd_line", "message", "explanation")
_ARGS_PATHS = ("process.args",)


@dataclass(frozen=True, slots=True)
class OutputLimits:
    """The caps of one log destination (bytes, except ``evidence``: items)."""

    cmdline: int = DEFAULT_CMDLINE_BYTES
    arg: int = DEFAULT_ARG_BYTES
    name: int = DEFAULT_NAME_BYTES
    record: int = DEFAULT_RECORD_BYTES
    evidence: int = DEFAULT_EVIDENCE

    def halved(self) -> OutputLimits:
        """Every string cap at half (not below the floor); the record budget unchanged."""
        return dataclasses.replace(
            self,
            cmdline=max(_FLOOR_BYTES, self.cmdline // 2),
            arg=max(_FLOOR_BYTES, self.arg // 2),
            name=max(_FLOOR_BYTES, self.name // 2),
        )

    @property
    def at_floor(self) -> bool:
        return max(self.cmdline, self.arg, self.name) <= _FLOOR_BYTES


def raw_bytes(text: str) -> bytes:
    """The bytes a string came from (invalid UTF-8 kept by ``surrogateescape`` comes back)."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate no decoder of ours makes
        return text.encode("utf-8", "surrogatepass")


def text_mark(data: bytes) -> dict[str, Any]:
    """``{"original_length": bytes, "sha256": hex}`` of an original value."""
    return {"original_length": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def cap_text(text: str, limit: int) -> tuple[str, dict[str, Any] | None]:
    """``text`` cut to at most ``limit`` bytes (on a character boundary), and its mark when cut."""
    if len(text) * 4 <= limit:  # cannot be over: skip the encode
        return text, None
    data = raw_bytes(text)
    if len(data) <= limit:
        return text, None
    end = limit
    # Back off to the start of a UTF-8 character (at most 3 continuation bytes).
    for _ in range(3):
        if end > 0 and 0x80 <= data[end] <= 0xBF:
            end -= 1
    cut = data[:end].decode("utf-8", "surrogateescape")
    return cut, text_mark(data)


def cap_args(
    args: list[str], limits: OutputLimits, memo: dict[Any, Any] | None = None
) -> tuple[list[str], dict[str, Any] | None]:
    """Each argument cut to ``limits.arg``, and the list to ``limits.cmdline`` bytes in all.

    ``memo`` keeps the mark of an argument list across the passes of :func:`fit_json`.
    """
    out: list[str] = []
    total = 0
    cut_any = False
    args = [a if isinstance(a, str) else str(a) for a in args]
    for arg in args:
        if total >= limits.cmdline:
            cut_any = True
            break
        capped, mark = cap_text(arg, min(limits.arg, limits.cmdline - total))
        cut_any = cut_any or mark is not None
        out.append(capped)
        total += len(raw_bytes(capped)) + 1
    if not cut_any:
        return list(args), None
    key = tuple(args)
    mark = memo.get(key) if memo is not None else None
    if mark is None:
        mark = text_mark(b"\x00".join(raw_bytes(a) for a in args))
        mark["original_count"] = len(args)
        if memo is not None:
            memo[key] = mark
    return out, dict(mark)


def bound_evidence(finding: Finding, keep: int) -> Finding:
    """A copy of ``finding`` with its ``keep`` heaviest pieces of evidence; the rest are counted."""
    if len(finding.evidence) <= keep:
        return finding
    ranked = sorted(finding.evidence, key=lambda e: -abs(e.weight))  # stable: ties keep order
    return dataclasses.replace(
        finding,
        evidence=ranked[:keep],
        evidence_omitted=finding.evidence_omitted + len(ranked) - keep,
    )


def _path_key(path: tuple[str, ...]) -> str:
    return ".".join(path)


def bound_value(
    value: Any,
    limits: OutputLimits,
    marks: dict[str, Any],
    path: tuple[str, ...] = (),
    memo: dict[Any, Any] | None = None,
) -> Any:
    """``value`` (a JSON document or part of one) with every string and list capped.

    Marks go into ``marks`` keyed by the dotted path (a list item by its index:
    ``gpuguard.evidence.3.detail``).
    """
    if isinstance(value, str):
        leaf = path[-1] if path else ""
        limit = limits.cmdline if leaf in _CMDLINE_LEAVES else limits.name
        capped, mark = cap_text(value, limit)
        if mark is not None:
            marks.setdefault(_path_key(path), mark)
        return capped
    if isinstance(value, dict):
        return {k: bound_value(v, limits, marks, (*path, str(k)), memo) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        key = _path_key(path)
        if key in _ARGS_PATHS:
            capped_args, mark = cap_args(list(value), limits, memo)
            if mark is not None:
                marks.setdefault(key, mark)
            return capped_args
        items = list(value)
        if len(items) > MAX_LIST_ITEMS:
            marks.setdefault(key, {"original_count": len(items)})
            items = items[:MAX_LIST_ITEMS]
        return [bound_value(v, limits, marks, (*path, str(i)), memo) for i, v in enumerate(items)]
    return value


def nest(flat: dict[str, Any]) -> dict[str, Any]:
    """``{"process.name": m}`` -> ``{"process": {"name": m}}`` (a longer path wins over its prefix)."""
    out: dict[str, Any] = {}
    for key in sorted(flat, key=lambda k: -k.count(".")):
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            child = node.get(part)
            if not isinstance(child, dict) or "sha256" in child or "original_count" in child:
                child = node[part] = {}
            node = child
        if leaf not in node:
            node[leaf] = flat[key]
    return out


def _set_path(doc: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = doc
    for part in path[:-1]:
        node = node.setdefault(part, {})
    node[path[-1]] = value


def bound_document(
    doc: dict[str, Any],
    limits: OutputLimits,
    mark_path: tuple[str, ...],
    memo: dict[Any, Any] | None = None,
) -> dict[str, Any]:
    """``doc`` with every string and list capped, the marks under ``mark_path`` + ``truncated``."""
    marks: dict[str, Any] = {}
    bounded = bound_value(doc, limits, marks, (), memo)
    if marks:
        _set_path(bounded, (*mark_path, "truncated"), nest(marks))
    return bounded


def fit_json(
    render: Callable[[int], dict[str, Any]],
    dumps: Callable[[Any], str],
    limits: OutputLimits,
    mark_path: tuple[str, ...],
    skeleton: Callable[[dict[str, Any]], dict[str, Any]],
    evidence_count: int = 0,
) -> str:
    """One JSON line within ``limits.record`` bytes.

    ``render(n)`` builds the document with at most ``n`` of its ``evidence_count``
    pieces of evidence;
    marks are written under ``mark_path`` (``truncated``, ``shed``);
    ``skeleton(doc)`` is the last resort: the document's fixed, bounded fields.
    """
    evidence = limits.evidence
    shed: list[str] = []
    current = limits
    memo: dict[Any, Any] = {}
    while True:
        bounded = bound_document(render(evidence), current, mark_path, memo)
        if shed:
            _set_path(bounded, (*mark_path, "shed"), list(shed))
        line = dumps(bounded)
        if len(line.encode("utf-8")) <= limits.record:
            return line
        if evidence > 1 and evidence_count > 1:
            evidence = 1 if evidence <= 3 or evidence_count <= 3 else 3
            if "evidence" not in shed:
                shed.append("evidence")
        elif not current.at_floor:
            current = current.halved()
            if "strings" not in shed:
                shed.append("strings")
        else:
            break
    last = skeleton(bounded)
    _set_path(last, (*mark_path, "shed"), [*shed, "fields"])
    _set_path(last, (*mark_path, "truncated"), {"record": text_mark(line.encode("utf-8"))})
    return dumps(last)


def pick(doc: dict[str, Any], paths: tuple[str, ...]) -> dict[str, Any]:
    """Only the dotted ``paths`` of ``doc`` (the skeleton of a record)."""
    out: dict[str, Any] = {}
    for dotted in paths:
        node: Any = doc
        parts = dotted.split(".")
        for part in parts:
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            if isinstance(node, str):
                node = cap_text(node, _FLOOR_BYTES)[0]
            _set_path(out, tuple(parts), node)
    return out
