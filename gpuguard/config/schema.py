"""One declarative config schema: each key's type, range or choices and doc, checked with positions.

A :class:`Key` names one setting: its YAML key, its type (``TYPES``), its
range (``low``/``high``) or ``choices``, the model field it fills and a line
of doc.  Its default is the model's (the dataclass the owner builds, e.g.
``AgentConfig``): declared once there, read from there by :func:`defaults`
and the generated reference.  A :class:`Section` is a mapping of keys.

:func:`check` walks a mapping against a section and returns the values it
accepted, by model field; each problem goes to ``add(path, message, key)``
(``key``: the problem is the mapping key, not its value), which places it at
``file:line:col``.  ``named=True`` words messages with the key's dotted name
("mode 'x' is not one of ..."): the agent config's top level, where ``add``
does not prefix the path; ``named=False`` leaves naming to ``add``
(:class:`gpuguard.errors.Problems` writes ``response.kill.grace_s: ...``).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuguard.errors import dotted

# type -> what a value of it is, in a message
TYPES = {
    "flag": "true or false",
    "whole": "a whole number",
    "number": "a number",
    "count": "a number",  # a number, kept as a whole number (int())
    "text": "a string",
    "texts": "a list of strings",  # a lone string is a list of one
    "choice": "one of the choices",
    "choices": "a list",  # a list of choices
    "networks": "a list of networks",  # CIDRs, normalised
    "indexes": "a list of GPU indexes",  # whole numbers >= 0, as a frozenset
    "names": "a list of names",  # strings, as a frozenset
    "size": "a size",  # bytes, or text like 40GiB
    "hours": "an hour range",  # "08-20": (8, 20)
    "list": "a list",  # checked further by its owner
    "mapping": "a mapping",  # checked further by its owner
}
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*([KMGT]i?B?)?$", re.I)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_HOURS = re.compile(r"^(\d{1,2})-(\d{1,2})$")
Add = Callable[..., None]  # add(path, message, key=False)


@dataclass(frozen=True, slots=True)
class Key:
    """One setting: YAML key, type, range or choices, the model field it fills, one line of doc."""

    key: str
    type: str
    doc: str = ""
    field: str = ""  # the model field it fills (not given: the key)
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    noun: str = ""  # a choice outside ``choices`` is "unknown NOUN 'x' (expected ...)"
    shows: str = ""  # the default as the reference shows it ("": the model's default)
    ref: Section | None = None  # a mapping or list entry's own keys (documented with this key)

    def __post_init__(self) -> None:
        assert self.type in TYPES, f"{self.key}: unknown schema type {self.type!r}"
        if not self.field:
            object.__setattr__(self, "field", self.key)  # frozen: filled once, here

    @property
    def name(self) -> str:
        return self.field or self.key


@dataclass(frozen=True, slots=True)
class Section:
    """A mapping of keys; ``field``: collect its values into one dict field of the outer model."""

    key: str
    keys: tuple[Key | Section, ...]
    doc: str = ""
    model: type | None = None  # whose instance gives these keys' defaults ("": the outer one)
    field: str = ""
    unknown: str = "key"  # the noun an unknown key is named with ("unknown key 'x'")

    def get(self, key: Any) -> Key | Section | None:
        return next((k for k in self.keys if k.key == key), None)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(k.key for k in self.keys)


def _either(choices: tuple[str, ...]) -> str:
    return choices[0] if len(choices) == 1 else f"{', '.join(choices[:-1])} or {choices[-1]}"


def _number_ok(value: Any, whole: bool) -> bool:
    kinds = int if whole else (int, float)
    return isinstance(value, kinds) and not isinstance(value, bool)


def check_value(spec: Key, value: Any, name: str) -> tuple[Any, str | None, int | None]:
    """``(value as the model keeps it, problem or None, index of the bad list item or None)``.

    ``name`` prefixes the problem ("" for none: the caller's ``add`` names the path).
    """
    lead = f"{name} " if name else ""
    kind = spec.type
    if kind in ("whole", "number", "count"):
        whole = kind == "whole"
        floor = spec.low is not None and spec.high is None
        expected = TYPES[kind] if kind != "count" else "a number"
        expected += f" >= {_num(spec.low)}" if floor else ""
        if not _number_ok(value, whole) or (floor and value < spec.low):
            if name:
                return None, f"{name} must be {expected}, not {_shown(value)}", None
            return None, f"expected {expected}, got {value!r}", None
        if spec.low is not None and spec.high is not None and not spec.low <= value <= spec.high:
            return None, f"{lead}{value} is outside {_num(spec.low)}-{_num(spec.high)}", None
        if kind == "count":
            return int(value), None, None
        return (float(value) if floor and kind == "number" else value), None, None
    if kind == "choice":
        if value not in spec.choices:
            return None, _not_a_choice(spec, value, lead), None
        return value, None, None
    if kind == "choices":
        if not isinstance(value, list):
            return None, _wrong_type(spec, value, name), None
        for i, item in enumerate(value):
            if item not in spec.choices:
                return None, _not_a_choice(spec, item, lead), i
        return value, None, None
    if kind in ("texts", "networks"):
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list):
            return None, f"{lead}expected a list".strip(), None
        for i, item in enumerate(items):
            at = i if isinstance(value, list) else None
            if not isinstance(item, str) and kind == "texts":
                return None, f"{lead}expected a string, got {item!r}", at
            if kind == "networks":
                try:
                    ipaddress.ip_network(str(item), strict=False)
                except ValueError:
                    return (
                        None,
                        f"{lead}{item!r} is not an address or network (e.g. 10.0.0.0/8)",
                        at,
                    )
        if kind == "networks":
            return tuple(str(ipaddress.ip_network(str(n), strict=False)) for n in items), None, None
        return tuple(items), None, None
    if kind == "indexes":
        if not isinstance(value, list) or not all(_number_ok(v, True) and v >= 0 for v in value):
            return None, f"{lead}expected a list of GPU indexes", None
        return frozenset(value), None, None
    if kind == "names":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            return None, f"{lead}expected a list of names", None
        return frozenset(value), None, None
    if kind == "size":
        if _number_ok(value, True) and value >= 0:
            return value, None, None
        match = _SIZE.match(str(value).strip())
        if not match:
            return None, f"{lead}{value!r} is not a size like 40GiB or 20000MiB", None
        unit = (match.group(2) or "")[:1].upper()
        return int(float(match.group(1)) * _UNITS[unit]), None, None
    if kind == "hours":
        match = _HOURS.match(str(value).strip())
        if not match or not all(0 <= int(h) <= 24 for h in match.groups()):
            return None, f"{lead}{value!r} is not an hour range like 08-20", None
        return (int(match.group(1)), int(match.group(2))), None, None
    ok = {
        "flag": lambda v: isinstance(v, bool),
        "text": lambda v: isinstance(v, str),
        "list": lambda v: isinstance(v, list),
        "mapping": lambda v: isinstance(v, Mapping),
    }[kind](value)
    return (value, None, None) if ok else (None, _wrong_type(spec, value, name), None)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _wrong_type(spec: Key, value: Any, name: str) -> str:
    expected = "text" if spec.type == "text" and name else TYPES[spec.type]
    if name:
        return f"{name} must be {expected}, not {_shown(value)}"
    return f"expected {expected}, got {value!r}"


def _not_a_choice(spec: Key, value: Any, lead: str) -> str:
    if spec.noun:
        return f"{lead}unknown {spec.noun} {value!r} (expected {', '.join(spec.choices)})"
    if lead:
        return f"{lead}{_shown(value)} is not one of {', '.join(spec.choices)}"
    return f"{value!r} is not {_either(spec.choices)}"


def _shown(value: Any) -> str:
    from gpuguard.config.yaml_marks import shown

    return shown(value)


def check(
    data: Mapping,
    section: Section,
    path: tuple,
    add: Add,
    *,
    named: bool = False,
    out: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The values in ``data`` that ``section`` accepts, by model field; each problem to ``add``.

    A bad or unknown key is left out, so the model's default stands in for it.
    """
    out = {} if out is None else out
    for key, value in data.items():
        spec = section.get(key)
        here = path + (key,)
        if spec is None:
            add(here, _unknown(section, key, named), key=True)
            continue
        if isinstance(spec, Section):
            if not isinstance(value, Mapping):
                add(here, f"{key} must be a mapping" if named else "expected a mapping")
                continue
            inner = check(value, spec, here, add, named=named, out={} if spec.field else out)
            if spec.field:
                out[spec.field] = inner
            continue
        converted, problem, index = check_value(spec, value, dotted(here) if named else "")
        if problem is None:
            out[spec.name] = converted
        else:
            add(here + ((index,) if index is not None else ()), problem)
    return out


def _unknown(section: Section, key: Any, named: bool) -> str:
    if named:
        return f"unknown {section.unknown} {key!r} (known here: {', '.join(sorted(section.names))})"
    return f"unknown {section.unknown} {key!r} (expected one of {', '.join(section.names)})"


def defaults(section: Section, model: type | None = None) -> dict[str, Any]:
    """Each key's default as the reference shows it, by dotted YAML path (the model's, declared once)."""
    model = section.model or model
    declared = {f.name for f in dataclasses.fields(model)} if model is not None else set()
    found: dict[str, Any] = {}
    for spec in section.keys:
        if isinstance(spec, Section):
            inner = defaults(spec, model)
            found.update({f"{spec.key}.{k}": v for k, v in inner.items()})
        elif spec.shows:
            found[spec.key] = spec.shows
        elif spec.name in declared and model is not None:
            default = field_default(model, spec.name)
            if default is not dataclasses.MISSING:
                found[spec.key] = default
    return found


def field_default(model: type, name: str) -> Any:
    """The default of dataclass ``model``'s field ``name`` (factories called; MISSING: none)."""
    for f in dataclasses.fields(model):
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                return f.default
            if f.default_factory is not dataclasses.MISSING:
                return f.default_factory()
            return dataclasses.MISSING  # a required field: no default
    raise KeyError(name)
