"""Checks a stored record (a msgpack map) against the annotations of the dataclass it rebuilds.

A recording may come from anywhere.  A map that unpacks is not yet a valid
item: ``sm_util: "x"`` inside a GPU snapshot or ``config_files: {a: 5}`` in a
process record would reach the renderer or the scorer and fail there.
:func:`record_checker` walks a dataclass's type hints once and returns a
function that checks every field, nested dataclasses, lists and dicts
included, and raises :class:`RecordTypeError` naming the first bad path.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from typing import Any

Check = Callable[[Any, str], None]


class RecordTypeError(ValueError):
    """A field of a stored record holds a value of the wrong type."""


def _fail(path: str, value: Any, expected: str) -> None:
    raise RecordTypeError(f"field {path!r} holds {type(value).__name__}, expected {expected}")


def _exact(kind: type, name: str) -> Check:
    def check(value: Any, path: str) -> None:
        if type(value) is not kind:
            _fail(path, value, name)

    return check


def _number(value: Any, path: str) -> None:
    if type(value) not in (int, float):
        _fail(path, value, "a number")


def _anything(value: Any, path: str) -> None:
    return None


def _checker(hint: Any) -> Check:
    if hint is Any:
        return _anything
    if hint is float:
        return _number
    if hint in (int, str, bytes, bool):
        return _exact(hint, hint.__name__)
    if hint is type(None):
        return _exact(type(None), "nothing")
    if dataclasses.is_dataclass(hint):
        return _explaining_checker(hint)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        options = [_checker(a) for a in args]
        names = " or ".join(getattr(a, "__name__", str(a)) for a in args)

        def check_union(value: Any, path: str) -> None:
            for option in options:
                try:
                    option(value, path)
                    return
                except RecordTypeError:
                    continue
            _fail(path, value, names)

        return check_union
    if origin is list:
        element = _checker(args[0]) if args else _anything

        def check_list(value: Any, path: str) -> None:
            if type(value) is not list:
                _fail(path, value, "a list")
            for i, item in enumerate(value):
                element(item, f"{path}[{i}]")

        return check_list
    if origin is tuple:  # stored as a msgpack array of fixed length
        elements = [_checker(a) for a in args]

        def check_tuple(value: Any, path: str) -> None:
            if type(value) not in (list, tuple) or len(value) != len(elements):
                _fail(path, value, f"a list of {len(elements)}")
            for i, (item, element) in enumerate(zip(value, elements, strict=False)):
                element(item, f"{path}[{i}]")

        return check_tuple
    if origin is dict:
        key_check, value_check = (
            (_checker(args[0]), _checker(args[1])) if args else (_anything, _anything)
        )

        def check_dict(value: Any, path: str) -> None:
            if type(value) is not dict:
                _fail(path, value, "a map")
            for key, item in value.items():
                key_check(key, f"{path} key")
                value_check(item, f"{path}[{key!r}]")

        return check_dict
    raise TypeError(
        f"no record check for annotation {hint!r}"
    )  # a new field type: teach this module


# --- the fast path: a predicate per annotation, no exceptions, no paths -------------------

Accept = Callable[[Any], bool]
_SIMPLE = {
    int: (int,),
    float: (int, float),
    str: (str,),
    bytes: (bytes,),
    bool: (bool,),
    type(None): (type(None),),
}


def _simple_types(hint: Any) -> tuple[type, ...] | None:
    """The exact value types ``hint`` allows, when it is a scalar or a union of scalars."""
    if hint in _SIMPLE:
        return _SIMPLE[hint]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        out: tuple[type, ...] = ()
        for arg in typing.get_args(hint):
            if arg not in _SIMPLE:
                return None
            out += _SIMPLE[arg]
        return out
    return None


def _predicate(hint: Any) -> Accept:
    if hint is Any:
        return lambda value: True
    simple = _simple_types(hint)
    if simple is not None:
        allowed = frozenset(simple)
        return lambda value: type(value) in allowed
    if dataclasses.is_dataclass(hint):
        return _record_predicate(hint)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        options = [_predicate(a) for a in args]
        return lambda value: any(option(value) for option in options)
    if origin is list:
        simple_element = _simple_types(args[0]) if args else None
        if simple_element is not None:
            element_types = frozenset(simple_element)
            return lambda value: (
                type(value) is list and all(type(v) in element_types for v in value)
            )
        element = _predicate(args[0]) if args else (lambda value: True)
        return lambda value: type(value) is list and all(map(element, value))
    if origin is tuple:
        elements = [_predicate(a) for a in args]
        return lambda value: (
            type(value) in (list, tuple)
            and len(value) == len(elements)
            and all(e(v) for e, v in zip(elements, value, strict=False))
        )
    if (
        origin is dict
        and args
        and _simple_types(args[0]) is not None
        and _simple_types(args[1]) is not None
    ):
        key_types, value_types = (
            frozenset(_simple_types(args[0])),
            frozenset(_simple_types(args[1])),
        )
        return lambda value: (
            type(value) is dict
            and all(type(k) in key_types and type(v) in value_types for k, v in value.items())
        )
    if origin is dict:
        key_ok, value_ok = (
            (_predicate(args[0]), _predicate(args[1])) if args else (lambda v: True, lambda v: True)
        )
        return lambda value: (
            type(value) is dict and all(key_ok(k) and value_ok(v) for k, v in value.items())
        )
    raise TypeError(f"no record check for annotation {hint!r}")


def _fields(cls: type) -> list[tuple[str, Any, bool]]:
    hints = typing.get_type_hints(cls)
    return [
        (
            f.name,
            hints[f.name],
            f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
        )
        for f in dataclasses.fields(cls)
        if f.init
    ]


class _Missing:
    """The type of a field a record leaves out; an optional scalar field allows it."""


_MISSING = _Missing()


def _record_predicate(cls: type) -> Accept:
    # Scalar fields (most of them) are one type-set lookup each: the hot path of
    # replaying GPU snapshots, which hold many devices and processes.
    scalars: list[tuple[str, frozenset[type]]] = []
    nested: list[tuple[str, Accept, bool]] = []
    for name, hint, required in _fields(cls):
        simple = _simple_types(hint)
        if simple is not None:
            scalars.append((name, frozenset(simple if required else (*simple, _Missing))))
        else:
            nested.append((name, _predicate(hint), required))

    def accept(record: Any) -> bool:
        if type(record) is not dict:
            return False
        get = record.get
        for name, allowed in scalars:
            if type(get(name, _MISSING)) not in allowed:
                return False
        for name, ok, required in nested:
            value = get(name, _MISSING)
            if value is _MISSING:
                if required:
                    return False
            elif not ok(value):
                return False
        return True

    return accept


def record_checker(cls: type) -> Check:
    """A check of a stored map against ``cls``: known fields typed, required fields present.

    Unknown keys are allowed (a newer recorder's fields are dropped by the caller).
    A fast predicate accepts good records; only a bad one is walked again to name
    the first bad field.
    """
    accept = _record_predicate(cls)
    explain = _explaining_checker(cls)

    def check(record: Any, path: str = "") -> None:
        if not accept(record):
            explain(record, path)

    return check


def _explaining_checker(cls: type) -> Check:
    fields = [(name, _checker(hint), required) for name, hint, required in _fields(cls)]

    def check(record: Any, path: str = "") -> None:
        if type(record) is not dict:
            _fail(path or cls.__name__, record, f"a {cls.__name__} map")
        for name, field_check, required in fields:
            where = f"{path}.{name}" if path else name
            if name in record:
                field_check(record[name], where)
            elif required:
                raise RecordTypeError(f"field {where!r} is missing")

    return check
