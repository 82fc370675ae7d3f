"""YAML reading that remembers where every key and value came from (line, column).

Rule errors must name ``file:line:col``; PyYAML's composer keeps a mark on
every node, so we compose, convert the node tree to plain values, and record
the marks by path (``("rules", 3, "condition", "all", 0)``).  Duplicate keys,
which plain ``yaml.safe_load`` silently merges, are reported.  A plain mapping
key ``on``, ``off``, ``yes`` or ``no`` stays text (YAML 1.1 would make it a
boolean, so the documented hook key ``on:`` would be lost); ``true:`` and
``false:`` keys stay booleans, and the schemas report them as unknown keys.

Before composing, the text is walked once with YAML's event parser (iterative,
no recursion) to bound nesting depth and the size of the document once aliases
are expanded: PyYAML's C composer recurses per level (50,000 levels crash the
interpreter) and an alias bomb of a few hundred bytes expands to billions of
nodes.  Anything over a limit is one problem naming the limit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpuguard.config.filecheck import read_regular_file, refusal_reason
from gpuguard.errors import GpuguardError

Path_ = tuple[Any, ...]
MAX_DEPTH = 64  # nesting levels (rule conditions need a handful)
MAX_NODES = 200_000  # values in the document with every alias expanded (the shipped rules: ~5,000)
SHOWN_MAX = 60  # a value quoted back in a problem: never more than this much of it
# Plain keys YAML 1.1 would read as booleans but that are kept as the words written (any case).
WORD_KEYS = ("on", "off", "yes", "no")


def shown(value: Any, limit: int = SHOWN_MAX) -> str:
    """``repr(value)`` cut to ``limit`` characters: problems quote a short excerpt, never a whole file."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass(frozen=True, slots=True)
class Position:
    file: str
    line: int  # 1-based
    col: int  # 1-based

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


@dataclass(slots=True)
class MarkedDocument:
    """Plain data plus the position of every value and mapping key in it."""

    file: str
    data: Any
    values: dict[Path_, Position] = field(default_factory=dict)
    keys: dict[Path_, Position] = field(default_factory=dict)
    problems: list[tuple[Position, str]] = field(default_factory=list)

    def at(self, path: Path_) -> Position:
        """Position of the value at ``path`` (or of its nearest enclosing value)."""
        while path not in self.values and path:
            path = path[:-1]
        return self.values.get(path, Position(self.file, 1, 1))

    def key_at(self, path: Path_) -> Position:
        """Position of the mapping key that ends ``path`` (falls back to the value)."""
        return self.keys.get(path) or self.at(path)


class _Converter:
    def __init__(self, file: str) -> None:
        self.doc = MarkedDocument(file, None)
        self.constructor = yaml.constructor.SafeConstructor()

    def pos(self, node: yaml.Node) -> Position:
        return Position(self.doc.file, node.start_mark.line + 1, node.start_mark.column + 1)

    def convert(self, node: yaml.Node, path: Path_, depth: int = 0) -> Any:
        self.doc.values[path] = self.pos(node)
        if depth > 64:
            self.doc.problems.append((self.pos(node), "nesting is too deep"))
            return None
        if isinstance(node, yaml.MappingNode):
            out: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                if not isinstance(key_node, yaml.ScalarNode):
                    self.doc.problems.append(
                        (self.pos(key_node), "mapping keys must be plain values")
                    )
                    continue
                if key_node.tag.endswith(":merge"):
                    self.doc.problems.append(
                        (self.pos(key_node), "YAML merge keys (<<) are not supported in rule files")
                    )
                    continue
                if key_node.tag.endswith(":bool") and key_node.value.lower() in WORD_KEYS:
                    # YAML 1.1 reads a plain `on:` (or off, yes, no) as a boolean; as a key it
                    # is always the word (hooks' `on:`).  `true:` and `false:` stay booleans.
                    key = key_node.value
                else:
                    try:
                        key = self.constructor.construct_object(key_node)
                    except yaml.constructor.ConstructorError as exc:
                        self.doc.problems.append(
                            (self.pos(key_node), f"YAML value error: {exc.problem}")
                        )
                        continue
                if not isinstance(key, (str, int, bool)) or key is None:
                    self.doc.problems.append(
                        (self.pos(key_node), f"mapping key {key!r} must be text")
                    )
                    continue
                if key in out:
                    self.doc.problems.append((self.pos(key_node), f"duplicate key {key!r}"))
                    continue
                self.doc.keys[path + (key,)] = self.pos(key_node)
                out[key] = self.convert(value_node, path + (key,), depth + 1)
            return out
        if isinstance(node, yaml.SequenceNode):
            return [self.convert(item, path + (i,), depth + 1) for i, item in enumerate(node.value)]
        try:
            return self.constructor.construct_object(node)
        except yaml.constructor.ConstructorError as exc:
            self.doc.problems.append((self.pos(node), f"YAML value error: {exc.problem}"))
            return None


def _over_limit(text: str) -> tuple[yaml.Mark | None, str] | None:
    """Where and how ``text`` exceeds MAX_DEPTH or MAX_NODES (None: within both), without composing it."""
    sizes: dict[str, int] = {}  # expanded size of each anchored value
    open_: list[list] = []  # [anchor, expanded size so far] per open collection
    total = 0
    for event in yaml.parse(text, Loader=_Loader):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            open_.append([event.anchor, 1])
            total += 1
            if len(open_) > MAX_DEPTH:
                return event.start_mark, f"nesting deeper than {MAX_DEPTH} levels"
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            anchor, size = open_.pop()
            if anchor is not None:
                sizes[anchor] = size
            if open_:
                open_[-1][1] += size
            continue
        elif isinstance(event, (yaml.ScalarEvent, yaml.AliasEvent)):
            size = 1 if isinstance(event, yaml.ScalarEvent) else sizes.get(event.anchor, 1)
            if isinstance(event, yaml.ScalarEvent) and event.anchor is not None:
                sizes[event.anchor] = 1
            total += size
            if open_:
                open_[-1][1] += size
        if total > MAX_NODES:
            return event.start_mark, (
                f"more than {MAX_NODES:,} values once aliases are expanded "
                "(an alias bomb, or a file far larger than any rules file)"
            )
    return None


def load_marked(text: str, file: str) -> MarkedDocument:
    """Parse one YAML document; syntax errors and limits become ``problems`` (never exceptions)."""
    converter = _Converter(file)
    try:
        limit = _over_limit(text)
        if limit is not None:
            mark, what = limit
            position = (
                Position(file, mark.line + 1, mark.column + 1) if mark else Position(file, 1, 1)
            )
            converter.doc.problems.append((position, f"refusing to read the rules: {what}"))
            return converter.doc
        node = yaml.compose(text, Loader=_Loader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        position = Position(file, mark.line + 1, mark.column + 1) if mark else Position(file, 1, 1)
        converter.doc.problems.append(
            (position, f"YAML syntax error: {exc.problem or exc.context}")
        )
        return converter.doc
    except yaml.YAMLError as exc:
        converter.doc.problems.append((Position(file, 1, 1), f"YAML error: {exc}"))
        return converter.doc
    if node is None:
        converter.doc.data = None
        return converter.doc
    converter.doc.data = converter.convert(node, ())
    return converter.doc


def load_marked_file(path: Path, max_bytes: int, what: str = "rules file") -> MarkedDocument:
    """Read (a regular file of at most ``max_bytes``: ``filecheck``) and parse; raises GpuguardError
    naming the file as ``what``."""
    data = read_regular_file(path, max_bytes, what)
    return load_marked(data.decode("utf-8", errors="replace"), str(path))


def load_trusted_file(path: Path, max_bytes: int, what: str) -> MarkedDocument:
    """:func:`load_marked_file` of a file root can trust (``filecheck.refusal_reason``), named
    as ``what`` and its path; raises GpuguardError naming the cause and the fix otherwise."""
    reason = refusal_reason(path, what, f"{what} {path}")
    if reason is not None:
        raise GpuguardError(*reason)
    return load_marked_file(path, max_bytes, f"{what} {path}")
