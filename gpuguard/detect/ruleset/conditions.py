"""The condition language: YAML maps compiled once into fast closures.

Details: docs/internals.md, "conditions".
"""

from __future__ import annotations

import fnmatch
import ipaddress
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import re2

from gpuguard.config.yaml_marks import Position, shown
from gpuguard.detect.signals.reader import SignalReader
from gpuguard.detect.signals.table import SIGNALS
from gpuguard.events.ioctl_names import is_ioctl_name

Condition = Callable[[SignalReader], "list[str] | None"]

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


Problem_ = tuple[Position, str]


@dataclass(frozen=True, slots=True)
class Leaf:
    """One compiled test of one signal, kept beside the condition tree it is part of.

    The rescore policy reads these: which values a rule compares a clock signal with
    (``age_s``), and which tests of GPU-window signals can change a rule's outcome.
    """

    signal: str
    op: str
    operand: Any
    test: Condition


@dataclass(frozen=True, slots=True)
class Junction:
    """``all``, ``any`` or ``not`` of compiled parts: with the leaves, a condition's tree, which
    :func:`known_outcome` judges from some signals' values alone."""

    kind: str
    parts: tuple[Leaf | Junction, ...]


Shape = Leaf | Junction


def known_outcome(shape: Shape, known: dict[str, Any]) -> bool | None:
    """Whether the condition of ``shape`` matches when the signals named in ``known`` have those
    values: True or False, or None when that depends on a signal not in ``known``."""
    if type(shape) is Leaf:
        if shape.signal not in known or SIGNALS[shape.signal].parameter is not None:
            return None
        return shape.test(known) is not None
    answers = [known_outcome(part, known) for part in shape.parts]
    if shape.kind == "not":
        return None if answers[0] is None else not answers[0]
    decisive = shape.kind == "any"  # any: one True decides; all: one False decides
    if decisive in answers:
        return decisive
    return None if None in answers else not decisive


_SCALAR = ("bool", "number", "text")
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
_LIST_OPS = {"in_list", "glob_list", "matches_list", "domain_in_list", "cidr_in_list"}
_MAX_WITNESSES = 3


@dataclass(slots=True)
class ListDef:
    """A named list after merging every file: entries with where each came from."""

    name: str
    position: Position
    entries: list[tuple[Any, Position]] = field(default_factory=list)

    @property
    def values(self) -> list[Any]:
        return [v for v, _ in self.entries]


@dataclass(slots=True)
class CompileContext:
    lists: dict[str, ListDef]
    problems: list[Problem_] = field(default_factory=list)
    signals_used: set[str] = field(default_factory=set)
    leaves: list[Leaf] = field(default_factory=list)  # every signal test compiled, in order
    shape: Shape | None = None  # the tree of the condition compiled last
    lists_used: set[str] = field(default_factory=set)
    _compiled_lists: dict[tuple[str, str], Any] = field(default_factory=dict)


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.4g}"
    text = str(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# -- list compilation (once per list and operator) ---------------------------

_RANGE = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*$")


def _compile_list(ctx: CompileContext, name: str, op: str, numeric: bool) -> Any:
    cached = ctx._compiled_lists.get((name, op))
    if cached is not None:
        return cached
    listdef = ctx.lists[name]
    bad = ctx.problems.append
    if op == "in_list" and numeric:
        exact: set[float] = set()
        ranges: list[tuple[int, int]] = []
        for value, pos in listdef.entries:
            match = _RANGE.match(value) if isinstance(value, str) else None
            if _is_number(value):
                exact.add(value)
            elif isinstance(value, str) and value.strip().isdigit():
                exact.add(int(value))
            elif match and int(match[1]) <= int(match[2]):
                ranges.append((int(match[1]), int(match[2])))
            else:
                bad(
                    (
                        pos,
                        f"list {shown(name)}: {shown(value)} is not a number or range 'a-b' (the "
                        "list is used with a number signal)",
                    )
                )
        compiled: Any = (frozenset(exact), tuple(ranges))
    elif op == "in_list":
        compiled = frozenset(str(v).lower() if isinstance(v, str) else v for v in listdef.values)
    elif op == "glob_list":
        patterns = []
        for value, pos in listdef.entries:
            if not isinstance(value, str):
                bad((pos, f"list {shown(name)}: glob {shown(value)} must be text"))
            else:
                patterns.append(fnmatch.translate(value))
        compiled = re.compile("|".join(f"(?:{p})" for p in patterns) or r"(?!)", re.S)
    elif op == "matches_list":
        patterns = []
        for value, pos in listdef.entries:
            try:
                check_rule_regex(str(value))
                patterns.append(str(value))
            except ValueError as exc:
                bad((pos, f"list {shown(name)}: bad regular expression {shown(value)}: {exc}"))
        compiled = RuleRegexes(patterns)
    elif op == "domain_in_list":
        domains = set()
        for value, pos in listdef.entries:
            if not isinstance(value, str) or not re.fullmatch(
                r"[A-Za-z0-9_\-]+(\.[A-Za-z0-9_\-]+)*\.?", value
            ):
                bad((pos, f"list {shown(name)}: {shown(value)} is not a domain name"))
            else:
                domains.add(value.lower().rstrip("."))
        compiled = frozenset(domains)
    else:  # cidr_in_list
        networks = []
        for value, pos in listdef.entries:
            try:
                networks.append(ipaddress.ip_network(str(value), strict=False))
            except ValueError:
                bad(
                    (pos, f"list {shown(name)}: {shown(value)} is not an address or network (CIDR)")
                )
        compiled = tuple(networks)
    ctx._compiled_lists[(name, op)] = compiled
    return compiled


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
    if op in _LIST_OPS:
        return f"{op.replace('_', ' ')} {operand}"
    if op == "in":
        return "in [" + ", ".join(_fmt(o) for o in operand) + "]"
    return f"{op} {_fmt(operand)}"


def _leaf(
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


# -- compiling a condition tree -----------------------------------------------


def compile_condition(
    node: Any,
    path: tuple,
    at: Callable[[tuple], Position],
    key_at: Callable[[tuple], Position],
    ctx: CompileContext,
) -> Condition | None:
    """Compile ``node`` (found at ``path`` of a document); problems go to ``ctx.problems``, its
    tree to ``ctx.shape``."""
    compiled = _compile(node, path, at, key_at, ctx)
    if compiled is None:
        return None
    condition, ctx.shape = compiled
    return condition


def _compile(
    node: Any,
    path: tuple,
    at: Callable[[tuple], Position],
    key_at: Callable[[tuple], Position],
    ctx: CompileContext,
) -> tuple[Condition, Shape] | None:
    bad = ctx.problems.append
    if not isinstance(node, dict) or not node:
        bad(
            (
                at(path),
                "a condition must be a map: all:/any:/not: or {signal: NAME, OPERATOR: VALUE}",
            )
        )
        return None
    combinators = [k for k in ("all", "any", "not") if k in node]
    if combinators:
        kind = combinators[0]
        if len(node) != 1:
            extra = [k for k in node if k != kind]
            for key in extra:
                bad(
                    (
                        key_at(path + (key,)),
                        f"{kind}: must be alone in its map (found also {shown(key)})",
                    )
                )
            # its body is still checked, so every problem is listed at once
            _compile({kind: node[kind]}, path, at, key_at, ctx)
            return None
        body = node[kind]
        if kind == "not":
            compiled = _compile(body, path + ("not",), at, key_at, ctx)
            if compiled is None:
                return None
            inner, shape = compiled
            return (lambda r: [] if inner(r) is None else None), Junction("not", (shape,))
        if not isinstance(body, list) or not body:
            bad((at(path + (kind,)), f"{kind}: needs a non-empty list of conditions"))
            return None
        parts = [_compile(item, path + (kind, i), at, key_at, ctx) for i, item in enumerate(body)]
        if any(p is None for p in parts):
            return None
        parts_t = tuple(p[0] for p in parts)
        junction = Junction(kind, tuple(p[1] for p in parts))
        if kind == "all":

            def all_of(r: SignalReader) -> list[str] | None:
                out: list[str] = []
                for part in parts_t:
                    got = part(r)
                    if got is None:
                        return None
                    out += got
                return out

            return all_of, junction

        def any_of(r: SignalReader) -> list[str] | None:
            for part in parts_t:
                got = part(r)
                if got is not None:
                    return got
            return None

        return any_of, junction
    return _compile_leaf(node, path, at, key_at, ctx)


def _compile_leaf(
    node: dict, path: tuple, at, key_at, ctx: CompileContext
) -> tuple[Condition, Leaf] | None:
    bad = ctx.problems.append
    if "signal" not in node:
        for key in node:
            if key not in OPERATORS:
                bad(
                    (
                        key_at(path + (key,)),
                        f"unknown condition key {shown(key)} (expected all, any, not or signal)",
                    )
                )
        if any(key in OPERATORS for key in node):
            bad((at(path), "a condition with an operator needs `signal: NAME`"))
        return None
    name = node["signal"]
    if not isinstance(name, str) or name not in SIGNALS:
        close = [s for s in SIGNALS if isinstance(name, str) and (name in s or s in name)][:3]
        hint = (
            f" (did you mean {', '.join(close)}?)"
            if close
            else " (`gpuguard rules signals` lists them)"
        )
        bad((at(path + ("signal",)), f"unknown signal {shown(name)}{hint}"))
        return None
    type_ = SIGNALS[name].type
    parameter = SIGNALS[name].parameter
    key: str | tuple[str, str] = name
    label = name
    if parameter is not None:
        argument = node.get(parameter)
        if not isinstance(argument, str) or not argument:
            bad((at(path), f"signal {name}: needs `{parameter}: NAME` saying what to measure"))
            return None
        problem = _argument_problem(parameter, argument)
        if problem:
            bad((at(path + (parameter,)), f"signal {name}: {problem}"))
            return None
        key, label = (name, argument), f"{name}[{argument}]"
    ops = [k for k in node if k not in ("signal", parameter)]
    known = [k for k in ops if k in OPERATORS]
    for op in ops:
        if op not in OPERATORS:
            bad(
                (
                    key_at(path + (op,)),
                    f"unknown operator {shown(op)} (expected one of {', '.join(OPERATORS)})",
                )
            )
    if not ops or len(known) > 1:
        bad(
            (
                at(path),
                f"signal {name}: needs exactly one operator ({', '.join(OPERATORS)}), found {len(ops)}",
            )
        )
        return None
    if not known:
        return None
    op = known[0]
    operand = node[op]
    here = at(path + (op,))
    if type_ not in OPERATORS[op][0]:
        bad(
            (
                key_at(path + (op,)),
                f"operator {shown(op)} does not apply to {type_} signal {name} (use one of "
                f"{', '.join(o for o, (types, _) in OPERATORS.items() if type_ in types)})",
            )
        )
        return None
    ctx.signals_used.add(name)
    compiled = None
    numeric = type_ in ("number", "numbers")
    if op in _LIST_OPS:
        if not isinstance(operand, str) or operand not in ctx.lists:
            bad(
                (
                    here,
                    f"unknown list {shown(operand)}"
                    + (f" (lists: {', '.join(sorted(ctx.lists))})" if ctx.lists else ""),
                )
            )
            return None
        if op in ("domain_in_list", "cidr_in_list", "glob_list", "matches_list") and numeric:
            bad((here, f"operator {shown(op)} needs a text signal"))
            return None
        ctx.lists_used.add(operand)
        compiled = _compile_list(ctx, operand, op, numeric)
    elif op in ("gt", "gte", "lt", "lte"):
        if not _is_number(operand):
            bad((here, f"{op}: needs a number, got {shown(operand)}"))
            return None
    elif op == "is":
        expected = {"bool": bool, "number": (int, float), "text": str}[type_]
        if not isinstance(operand, expected) or (type_ == "number" and isinstance(operand, bool)):
            bad((here, f"is: {name} is a {type_} signal; {shown(operand)} is not a {type_}"))
            return None
    elif op == "in":
        if not isinstance(operand, list) or not operand:
            bad((here, "in: needs a non-empty inline list"))
            return None
        if numeric and not all(_is_number(o) for o in operand):
            bad((here, f"in: {name} is a number signal; every value must be a number"))
            return None
        if not numeric and not all(isinstance(o, str) for o in operand):
            bad((here, f"in: {name} is a text signal; every value must be text"))
            return None
    elif op == "empty":
        if not isinstance(operand, bool):
            bad((here, "empty: needs true or false"))
            return None
    elif op == "contains":
        if numeric and not _is_number(operand) or not numeric and not isinstance(operand, str):
            bad((here, f"contains: needs a {'number' if numeric else 'text'} value"))
            return None
    elif op in ("glob", "matches"):
        if not isinstance(operand, str):
            bad((here, f"{op}: needs text"))
            return None
        if op == "matches":
            try:
                check_rule_regex(operand)
            except ValueError as exc:
                bad((here, f"bad regular expression {shown(operand)}: {exc}"))
                return None
    if len(ops) != 1:  # an unknown operator beside this one (reported above)
        return None
    test = _leaf(key, label, type_, op, operand, compiled)
    leaf = Leaf(name, op, operand, test)
    ctx.leaves.append(leaf)
    return test, leaf


def _argument_problem(parameter: str, argument: str) -> str | None:
    """Why ``argument`` cannot be measured (None when it can)."""
    if parameter == "command" and not is_ioctl_name(argument):
        return (
            f"{shown(argument)} is not a decoded ioctl name (names such as NV_ESC_RM_CONTROL, "
            "UVM_REGISTER_CHANNEL, AMDKFD_IOC_CREATE_QUEUE: see docs/event-decoding.md)"
        )
    return None
