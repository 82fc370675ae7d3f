"""Member offsets of kernel structs from the running kernel's BTF (/sys/kernel/btf/vmlinux).

The probes read a few fields the kernel's tracepoints do not export (the FPU state a
context switch saves), whose offsets depend on the kernel's build.  The installed headers
may be another kernel's (a Debian 6.1 tree linked as fallback for 6.18), so the offsets are
taken from BTF, the kernel's own description of its types, and handed to the probe as
compiler defines.  This reads the format (linux/btf.h, docs: Documentation/bpf/btf.rst)
with ``struct`` alone: types are numbered in file order, so one pass records where each
type starts and the few lookups walk from there.

``Btf.load().path_offset("fpu", "fpstate")`` gives a byte offset, following a chain of
members through nested structs, unions, typedefs and qualifiers.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

VMLINUX = "/sys/kernel/btf/vmlinux"
_MAGIC = 0xEB9F
# kinds (linux/btf.h)
_INT, _PTR, _ARRAY, _STRUCT, _UNION, _ENUM, _FWD, _TYPEDEF = 1, 2, 3, 4, 5, 6, 7, 8
_VOLATILE, _CONST, _RESTRICT, _FUNC, _FUNC_PROTO, _VAR, _DATASEC = 9, 10, 11, 12, 13, 14, 15
_FLOAT, _DECL_TAG, _TYPE_TAG, _ENUM64 = 16, 17, 18, 19
# bytes after the 12-byte common header: fixed, and per vlen item
_EXTRA = {_INT: 4, _ARRAY: 12, _VAR: 4, _DECL_TAG: 4}
_PER_ITEM = {_STRUCT: 12, _UNION: 12, _ENUM: 8, _FUNC_PROTO: 8, _DATASEC: 12, _ENUM64: 12}
_QUALIFIERS = {_TYPEDEF, _VOLATILE, _CONST, _RESTRICT, _TYPE_TAG}


class BtfError(Exception):
    """BTF missing, malformed, or without the struct or member asked for."""


@dataclass(frozen=True, slots=True)
class _Type:
    kind: int
    name: str
    kind_flag: bool
    vlen: int
    size_or_type: int
    at: int  # offset of the item list (after the common header)


class Btf:
    """The types of one BTF blob (type id -> kind, name, members)."""

    def __init__(self, data: bytes) -> None:
        if len(data) < 24:
            raise BtfError("BTF blob too short")
        magic, _version, _flags, hdr_len, type_off, type_len, str_off, str_len = struct.unpack_from(
            "<HBBIIIII", data
        )
        if magic != _MAGIC:
            raise BtfError(f"not BTF (magic {magic:#x}); a big-endian or foreign blob")
        self._data = data
        self._types_at = hdr_len + type_off
        self._types_end = self._types_at + type_len
        self._strings_at = hdr_len + str_off
        self._strings_end = self._strings_at + str_len
        if self._types_end > len(data) or self._strings_end > len(data):
            raise BtfError("BTF sections run past the end of the blob")
        self._offsets: list[int] = [0]  # type id -> start of its header (id 0: void)
        self._by_name: dict[tuple[int, str], int] = {}
        self._index()

    @classmethod
    def load(cls, path: str = VMLINUX) -> Btf:
        try:
            with open(path, "rb") as f:
                return cls(f.read())
        except OSError as exc:
            raise BtfError(f"cannot read {path}: {exc.strerror}") from None

    def _string(self, offset: int) -> str:
        start = self._strings_at + offset
        end = self._data.find(b"\0", start, self._strings_end)
        return self._data[start : end if end >= 0 else self._strings_end].decode("ascii", "replace")

    def _index(self) -> None:
        data, pos, end = self._data, self._types_at, self._types_end
        unpack = struct.unpack_from
        names_wanted = (_STRUCT, _UNION)
        while pos < end:
            name_off, info, _ = unpack("<III", data, pos)
            kind, vlen = (info >> 24) & 0x1F, info & 0xFFFF
            type_id = len(self._offsets)
            self._offsets.append(pos)
            if kind in names_wanted and name_off:
                self._by_name.setdefault((kind, self._string(name_off)), type_id)
            pos += 12 + _EXTRA.get(kind, 0) + _PER_ITEM.get(kind, 0) * vlen
        if pos != end:
            raise BtfError("BTF type section ends inside a type (unknown kind?)")

    def _type(self, type_id: int) -> _Type:
        if not 0 < type_id < len(self._offsets):
            raise BtfError(f"BTF type id {type_id} out of range")
        pos = self._offsets[type_id]
        name_off, info, size_or_type = struct.unpack_from("<III", self._data, pos)
        return _Type(
            (info >> 24) & 0x1F,
            self._string(name_off),
            bool(info >> 31),
            info & 0xFFFF,
            size_or_type,
            pos + 12,
        )

    def struct_id(self, name: str) -> int:
        """Type id of ``struct name`` (or ``union name``)."""
        for kind in (_STRUCT, _UNION):
            type_id = self._by_name.get((kind, name))
            if type_id is not None:
                return type_id
        raise BtfError(f"no struct {name} in BTF")

    def _resolve(self, type_id: int) -> tuple[int, _Type]:
        """Follow typedefs and qualifiers to the type they name."""
        for _ in range(32):
            t = self._type(type_id)
            if t.kind not in _QUALIFIERS:
                return type_id, t
            type_id = t.size_or_type
        raise BtfError("BTF typedef chain too long")

    def member(self, type_id: int, name: str) -> tuple[int, int]:
        """(byte offset, member type id) of ``name`` in a struct/union, searching anonymous
        members' insides as C does."""
        _, t = self._resolve(type_id)
        if t.kind not in (_STRUCT, _UNION):
            raise BtfError(f"type {t.name or type_id} is not a struct or union")
        for i in range(t.vlen):
            name_off, member_type, offset = struct.unpack_from("<III", self._data, t.at + 12 * i)
            bits = offset & 0xFFFFFF if t.kind_flag else offset
            member_name = self._string(name_off)
            if member_name == name:
                if bits % 8:
                    raise BtfError(f"member {name} is a bit field")
                return bits // 8, member_type
            if not member_name:
                try:
                    inner, inner_type = self.member(member_type, name)
                except BtfError:
                    continue
                return bits // 8 + inner, inner_type
        raise BtfError(f"no member {name} in {t.name or f'type {type_id}'}")

    def path_offset(self, struct_name: str, *members: str) -> int:
        """Byte offset of ``struct_name.members[0].members[1]...`` (no pointers followed)."""
        type_id, offset = self.struct_id(struct_name), 0
        for name in members:
            inner, type_id = self.member(type_id, name)
            offset += inner
        return offset

    def size_of(self, struct_name: str) -> int:
        return self._type(self.struct_id(struct_name)).size_or_type
