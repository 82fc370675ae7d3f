"""The condition language's operators: what each applies to, and the compiled test of one signal.

Details: docs/internals.md, "conditions".
"""

from __future__ import annotations

import fnmatch
import ipaddress
import re
from collections.abc import Callable
from typing import Any

import re2

from gpuguard.detect.ruleset.condition_tree import Condition
from gpuguard.detect.signals.reader import SignalReader

# Rule regexes run on attacker-chosen text (command lines, payload fields): RE2 matches in
# linear time, so `(a+)+$` cannot hang a scan.  Patterns RE2 cannot take (back-references,
# look-around) are rejected when the rules are validated.
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # the problem is reported as a rule problem, not logged to stderr


def check_rule_regex(pattern: str) -> None:
    """Raise ValueError saying why when ``pattern`` is not a regex, or one RE2 cannot run."""
    try:
        re.compile(pattern)  # Python's wording for plain syntax errors (what rule authors know)
    except re.error as exc:
        raise ValueError(str(exc)) from None
    try:
        re2.compile(pattern, _RE2_OPTIONS)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else "invalid"
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise ValueError(
            f"RE2 cannot run it in linear time: {reason} (rule regexes use RE2 syntax: "
            "no back-references or look-around)"
        ) from None
    except TypeError as exc:
        raise ValueError(str(exc)) from None


class RuleRegexes:
    """One or more rule regexes searched in one linear-time pass (an RE2 set).

    The text is searched as UTF-8 bytes; the bytes of an invalid UTF-8 argument
    (kept as surrogate escapes) are searched as they are, never an error.
    """

    __slots__ = ("patterns", "_set")

    def __init__(self, patterns: list[str]) -> None:
        self.patterns = tuple(patterns)
        regex_set = re2.Set.SearchSet(_RE2_OPTIONS)
        for pattern in self.patterns:
            regex_set.Add(pattern)
        if self.patterns:
            regex_set.Compile()
        self._set = regex_set

    def search(self, text: str) -> bool:
        """Whether any of the patterns is found in ``text``."""
        return (
            bool(self.patterns)
            and self._set.Match(text.encode("utf-8", "surrogateescape")) is not None
        )


_SETS = ("texts", "numbers")
OPERATORS: dict[str, tuple[tuple[str, ...], str]] = {
    # name: (signal types it applies to, what it means)
    "is": (("bool", "number", "text"), "equals the value"),
    "in": (("number", "text", "texts", "numbers"), "is one of the values listed inline"),
    "in_list": (
        ("number", "text", "texts", "numbers"),
        "is an entry of the named list (numbers lists may hold ranges 'a-b')",
    ),
    "contains": (
        ("text", "texts", "numbers"),
        "text contains the substring / set contains the element",
    ),
    "glob": (("text", "texts"), "matches the shell pattern"),
    "glob_list": (("text", "texts"), "matches a shell pattern of the named list"),
    "matches": (("text", "texts"), "matches the regular expression (search)"),
    "matches_list": (("text", "texts"), "matches a regular expression of the named list"),
    "domain_in_list": (("text", "texts"), "is a domain of the named list or a subdomain of one"),
    "cidr_in_list": (("text", "texts"), "is an address inside a network of the named list"),
    "gt": (("number", "numbers"), "greater than"),
    "gte": (("number", "numbers"), "greater than or equal"),
    "lt": (("number", "numbers"), "less than"),
    "lte": (("number", "numbers"), "less than or equal"),
    "empty": (("text", "texts", "numbers"), "is empty (true) or not empty (false)"),
}
LIST_OPS = {"in_list", "glob_list", "matches_list", "domain_in_list", "cidr_in_list"}
_MAX_WITNESSES = 3


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.4g}"
    text = str(value)
    return text if len(text) <= 120 else text[:117] + "..."


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# -- element tests: (value) -> bool ------------------------------------------


def _element_test(op: str, operand: Any, compiled: Any, numeric: bool) -> Callable[[Any], bool]:
    if op == "is":
        if isinstance(operand, str):
            low = operand.lower()
            return lambda v: isinstance(v, str) and v.lower() == low
        return lambda v: (
            v == operand and type(v) is not bool if not isinstance(operand, bool) else v is operand
        )
    if op == "in":
        values = _members(op, operand, compiled, numeric)
        return lambda v: (v.lower() if isinstance(v, str) else v) in values
    if op == "in_list":
        if numeric:
            exact, ranges = compiled
            if not ranges:
                return exact.__contains__
            if len(ranges) == 1:
                ((low, high),) = ranges
                return lambda v: v in exact or low <= v <= high
            return lambda v: v in exact or any(lo <= v <= hi for lo, hi in ranges)
        return lambda v: (v.lower() if isinstance(v, str) else v) in compiled
    if op == "contains":  # text: substring (case-insensitive); sets use equality (see _set_leaf)
        needle = str(operand).lower()
        return lambda v: needle in v.lower()
    if op == "glob":
        rx = re.compile(fnmatch.translate(operand), re.S)
        return lambda v: rx.match(v) is not None
    if op == "glob_list":
        return lambda v: compiled.match(v) is not None
    if op == "matches":
        return RuleRegexes([operand]).search
    if op == "matches_list":
        return compiled.search
    if op == "domain_in_list":

        def in_domains(v: str) -> bool:
            parts = v.lower().rstrip(".").split(".")
            return any(".".join(parts[i:]) in compiled for i in range(len(parts)))

        return in_domains
    if op == "cidr_in_list":

        def in_networks(v: str) -> bool:
            try:
                address = ipaddress.ip_address(v.split("%", 1)[0])
            except ValueError:
                return False
            if address.version == 6 and address.ipv4_mapped:
                address = address.ipv4_mapped
            return any(address in n for n in compiled)

        return in_networks
    comparisons = {
        "gt": lambda v: v > operand,
        "gte": lambda v: v >= operand,
        "lt": lambda v: v < operand,
        "lte": lambda v: v <= operand,
    }
    return comparisons[op]


def _members(op: str, operand: Any, compiled: Any, numeric: bool) -> frozenset | None:
    """The set an ``in``/``in_list`` test looks values up in (texts lower-case); None when the
    test is not plain membership (another operator, or a number list with ranges)."""
    if op == "in":
        return frozenset(o.lower() if isinstance(o, str) else o for o in operand)
    if op == "in_list":
        if not numeric:
            return compiled
        exact, ranges = compiled
        return None if ranges else exact
    return None


def _set_selector(
    op: str, operand: Any, compiled: Any, numeric: bool, test: Callable[[Any], bool]
) -> Callable[[Any], list]:
    """The elements of a set signal that pass ``test``; membership tests inlined (no call per element)."""
    members = _members(op, operand, compiled, numeric)
    if members is None:
        return lambda values: [e for e in values if test(e)]
    if numeric:
        return lambda values: [e for e in values if e in members]
    return lambda values: [e for e in values if (e.lower() if type(e) is str else e) in members]


def _describe(op: str, operand: Any) -> str:
    symbols = {"gt": ">", "gte": ">=", "lt": "<", "lte": "<="}
    if op in symbols:
        return f"{symbols[op]} {_fmt(operand)}"
    if op in LIST_OPS:
        return f"{op.replace('_', ' ')} {operand}"
    if op == "in":
        return "in [" + ", ".join(_fmt(o) for o in operand) + "]"
    return f"{op} {_fmt(operand)}"


def leaf_test(
    key: str | tuple[str, str], label: str, type_: str, op: str, operand: Any, compiled: Any
) -> Condition:
    """A test of one signal: ``key`` is what the reader is asked for, ``label`` what the witness shows."""
    numeric = type_ in ("number", "numbers")
    about = _describe(op, operand)
    if op == "empty":
        want = bool(operand)

        def empty_leaf(r: SignalReader) -> list[str] | None:
            v = r[key]
            if v is None or (not v) != want:
                return None
            return [f"{label} {'empty' if want else 'not empty'}"]

        return empty_leaf
    if type_ in _SETS and op == "contains":
        wanted = operand.lower() if isinstance(operand, str) else operand

        def contains_leaf(r: SignalReader) -> list[str] | None:
            v = r[key]
            if not v or wanted not in v:
                return None
            return [f"{label} contains {_fmt(operand)}"]

        return contains_leaf
    test = _element_test(op, operand, compiled, numeric)
    if type_ in _SETS:
        select = _set_selector(op, operand, compiled, numeric, test)

        def set_leaf(r: SignalReader) -> list[str] | None:
            v = r[key]
            if not v:
                return None
            hits = select(v)
            if not hits:
                return None
            hits.sort(key=str)
            shown = ",".join(_fmt(h) for h in hits[:_MAX_WITNESSES]) + (
                ",..." if len(hits) > _MAX_WITNESSES else ""
            )
            return [f"{label}={shown} ({about})"]

        return set_leaf

    def scalar_leaf(r: SignalReader) -> list[str] | None:
        v = r[key]
        if v is None or not test(v):
            return None
        return [f"{label}={_fmt(v)} ({about})"]

    return scalar_leaf
