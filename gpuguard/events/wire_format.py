"""The recording format: its names, each item's kind and stored map, and the checked way back.

A recording is a msgpack stream: a header map, one map per item (dispatched on ``"kind"``:
an event kind from :data:`gpuguard.events.model.EVENT_TYPES`, ``"gpu_snapshot"`` or
``"process"``) and an end marker with the item count and a CRC-32.  ``wire_write`` writes
it, ``wire`` reads it.  The format, and why the marker and checksum:
docs/event-decoding.md, "Recordings".
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
from collections.abc import Callable
from typing import Any

from gpuguard.events.gpu_snapshot import GpuSnapshot
from gpuguard.events.model import EVENT_TYPES, Event
from gpuguard.events.process_facts import ProcessFacts
from gpuguard.events.record_types import RecordTypeError, record_checker

FORMAT_NAME = "gpuguard-recording"
FORMAT_VERSION = 1
SNAPSHOT_KIND = "gpu_snapshot"
PROCESS_KIND = "process"
END_KIND = "recording_end"

Item = Event | GpuSnapshot | ProcessFacts

UNICODE_ERRORS = "surrogateescape"


def item_kind(item: Item) -> str:
    """The ``kind`` an item is stored (and shown in ``replay --json``) under: the one place that decides."""
    if isinstance(item, Event):
        return item.kind
    if isinstance(item, GpuSnapshot):
        return SNAPSHOT_KIND
    if isinstance(item, ProcessFacts):
        return PROCESS_KIND
    raise TypeError(
        f"cannot record a {type(item).__name__}: expected an Event, GpuSnapshot or ProcessFacts"
    )


def item_record(item: Item) -> dict[str, Any]:
    """The map an item is stored as."""
    if isinstance(item, Event):
        return item.to_record()
    return {"kind": item_kind(item), **item.to_record()}


# --- decoding items ----------------------------------------------------------------


class BadItem(Exception):
    """An item that unpacked but is not a valid record."""


_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "float": (float, int),
    "int": (int,),
    "str": (str,),
    "bytes": (bytes,),
    "bool": (bool,),
}


def _field_checks(cls: type[Event]) -> list[tuple[str, tuple[type, ...], tuple[type, ...] | None]]:
    """(field, allowed types, allowed element types) from the dataclass annotations."""
    checks = []
    for f in dataclasses.fields(cls):
        annotation = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
        if annotation in _FIELD_TYPES:
            checks.append((f.name, _FIELD_TYPES[annotation], None))
        elif annotation.startswith("dict"):
            checks.append((f.name, (dict,), None))
        elif annotation.startswith("list["):
            element = _FIELD_TYPES.get(annotation[5:-1])
            checks.append((f.name, (list,), element))
    return checks


def _event_decoder(cls: type[Event]) -> Callable[[dict[str, Any]], Event]:
    names = frozenset(f.name for f in dataclasses.fields(cls))
    checks = _field_checks(cls)
    kind = cls.kind
    # The common case in one C-level step: the tuple of the field value types
    # must be one of the allowed combinations (only float fields allow two).
    values_of = operator.attrgetter(*(name for name, _, _ in checks))
    allowed_types = frozenset(itertools.product(*(allowed for _, allowed, _ in checks)))
    element_checks = [(name, element) for name, _, element in checks if element is not None]

    def decode(record: dict[str, Any]) -> Event:
        del record["kind"]
        try:
            event = cls(**record)
        except TypeError:
            # Fields this version does not know (a newer recorder) are dropped;
            # a missing required field is damage.
            try:
                event = cls(**{k: v for k, v in record.items() if k in names})
            except TypeError as exc:
                raise BadItem(f"{kind} record with bad fields ({exc})") from None
        if tuple(map(type, values_of(event))) not in allowed_types:
            for name, allowed, _ in checks:
                value = getattr(event, name)
                if type(value) not in allowed:
                    raise BadItem(f"{kind} field {name!r} holds {type(value).__name__}")
        for name, element in element_checks:
            if any(type(v) not in element for v in getattr(event, name)):
                raise BadItem(f"{kind} field {name!r} holds a non-{element[0].__name__} entry")
        return event

    return decode


_SNAPSHOT_CHECK = record_checker(GpuSnapshot)
_PROCESS_CHECK = record_checker(ProcessFacts)


def _checked(check: Callable[[Any], None], record: dict[str, Any], kind: str) -> None:
    try:
        check(record)
    except RecordTypeError as exc:
        raise BadItem(f"{kind} record with bad fields ({exc})") from None


def _require_number(record: dict[str, Any], key: str, kind: str) -> None:
    if type(record.get(key)) not in (float, int):
        raise BadItem(f"{kind} record without a numeric {key!r}")


def _decode_snapshot(record: dict[str, Any]) -> GpuSnapshot:
    _require_number(record, "time", SNAPSHOT_KIND)
    _checked(_SNAPSHOT_CHECK, record, SNAPSHOT_KIND)
    try:
        return GpuSnapshot.from_record(record)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise BadItem(f"{SNAPSHOT_KIND} record with bad fields ({exc})") from None


def _decode_process(record: dict[str, Any]) -> ProcessFacts:
    _require_number(record, "start_time", PROCESS_KIND)
    if type(record.get("pid")) is not int:
        raise BadItem(f"{PROCESS_KIND} record without an integer 'pid'")
    _checked(_PROCESS_CHECK, record, PROCESS_KIND)
    try:
        return ProcessFacts.from_record(record)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise BadItem(f"{PROCESS_KIND} record with bad fields ({exc})") from None


DECODERS: dict[str, Callable[[dict[str, Any]], Item]] = {
    kind: _event_decoder(cls) for kind, cls in EVENT_TYPES.items()
}
DECODERS[SNAPSHOT_KIND] = _decode_snapshot
DECODERS[PROCESS_KIND] = _decode_process


def item_from_record(record: object) -> Item:
    """Rebuild an item from its stored map; raises ValueError for anything else."""
    try:
        return decode_item(record)
    except BadItem as exc:
        raise ValueError(str(exc)) from None


def decode_item(record: object) -> Item:
    if type(record) is not dict:
        raise BadItem(f"a {type(record).__name__} where a record map belongs")
    kind = record.get("kind")
    decoder = DECODERS.get(kind) if type(kind) is str else None
    if decoder is None:
        shown = repr(kind)[:60] if kind is not None else "none"
        raise BadItem(f"unknown record kind {shown}")
    return decoder(record)
