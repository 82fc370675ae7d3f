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
from typing import Any, Callable

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
        return record_checker(hint)
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
            for i, (item, element) in enumerate(zip(value, elements)):
                element(item, f"{path}[{i}]")
        return check_tuple
    if origin is dict:
        key_check, value_check = (_checker(args[0]), _checker(args[1])) if args else (_anything, _anything)

        def check_dict(value: Any, path: str) -> None:
            if type(value) is not dict:
                _fail(path, value, "a map")
            for key, item in value.items():
                key_check(key, f"{path} key")
                value_check(item, f"{path}[{key!r}]")
        return check_dict
    raise TypeError(f"no record check for annotation {hint!r}")  # a new field type: teach this module


def record_checker(cls: type) -> Check:
    """A check of a stored map against ``cls``: known fields typed, required fields present.

    Unknown keys are allowed (a newer recorder's fields are dropped by the caller).
    """
    hints = typing.get_type_hints(cls)
    fields = [(f.name, _checker(hints[f.name]),
               f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
              for f in dataclasses.fields(cls) if f.init]

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
