"""The condition language: YAML maps compiled once into fast closures.

The tree's types live in ``condition_tree``, the operators and their tests in ``operators``.
Details: docs/internals.md, "conditions".
"""

from __future__ import annotations

import fnmatch
import ipaddress
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpuguard.config.yaml_marks import Position, shown
from gpuguard.detect.ruleset.condition_tree import Condition, Junction, Leaf, Shape
from gpuguard.detect.ruleset.operators import (
    LIST_OPS,
    OPERATORS,
    RuleRegexes,
    check_rule_regex,
    is_number,
    leaf_test,
)
from gpuguard.detect.signals.reader import SignalReader
from gpuguard.detect.signals.table import SIGNALS
from gpuguard.events.ioctl_names import is_ioctl_name

Problem_ = tuple[Position, str]


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
            if is_number(value):
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
    if op in LIST_OPS:
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
        if not is_number(operand):
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
        if numeric and not all(is_number(o) for o in operand):
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
        if numeric and not is_number(operand) or not numeric and not isinstance(operand, str):
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
    test = leaf_test(key, label, type_, op, operand, compiled)
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
