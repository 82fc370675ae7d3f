"""YAML reading that remembers where every key and value came from (line, column).

Rule errors must name ``file:line:col``; PyYAML's composer keeps a mark on
every node, so we compose, convert the node tree to plain values, and record
the marks by path (``("rules", 3, "condition", "all", 0)``).  Duplicate keys,
which plain ``yaml.safe_load`` silently merges, are reported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

Path_ = tuple[Any, ...]
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass(frozen=True, slots=True)
class Position:
    file: str
    line: int     # 1-based
    col: int      # 1-based

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
                    self.doc.problems.append((self.pos(key_node), "mapping keys must be plain values"))
                    continue
                if key_node.tag.endswith(":merge"):
                    self.doc.problems.append((self.pos(key_node), "YAML merge keys (<<) are not supported in rule files"))
                    continue
                try:
                    key = self.constructor.construct_object(key_node)
                except yaml.constructor.ConstructorError as exc:
                    self.doc.problems.append((self.pos(key_node), f"YAML value error: {exc.problem}"))
                    continue
                if not isinstance(key, (str, int, bool)) or key is None:
                    self.doc.problems.append((self.pos(key_node), f"mapping key {key!r} must be text"))
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


def load_marked(text: str, file: str) -> MarkedDocument:
    """Parse one YAML document; syntax errors become ``problems`` (never exceptions)."""
    converter = _Converter(file)
    try:
        node = yaml.compose(text, Loader=_Loader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        position = Position(file, mark.line + 1, mark.column + 1) if mark else Position(file, 1, 1)
        converter.doc.problems.append((position, f"YAML syntax error: {exc.problem or exc.context}"))
        return converter.doc
    except yaml.YAMLError as exc:
        converter.doc.problems.append((Position(file, 1, 1), f"YAML error: {exc}"))
        return converter.doc
    if node is None:
        converter.doc.data = None
        return converter.doc
    converter.doc.data = converter.convert(node, ())
    return converter.doc


def load_marked_file(path: Path) -> MarkedDocument:
    return load_marked(path.read_text(encoding="utf-8", errors="replace"), str(path))
