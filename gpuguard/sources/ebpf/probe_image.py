"""What bcc's compile of the probes produced, as data the probe cache keeps.

Each map, each program's instructions, and where those load a map's fd (:class:`ProbeImage`).

An image holds only what :mod:`.image_bpf` rebuilds: the map kinds in MAP_TYPES, and programs
whose 64-bit loads of kernel objects are all loads of those maps' fds.  Anything else is not
captured, and :meth:`ProbeImage.check` refuses it in a file.
"""

from __future__ import annotations

import ctypes as ct
import struct
import time
from dataclasses import dataclass

import msgpack

from gpuguard.sources.ebpf.kernel_headers import HeaderSource

FORMAT = 1
# The map kinds an image may hold (linux/bpf.h): created here with bcc_create_map as bcc does.
MAP_TYPES = {1, 2, 3, 4, 5, 6, 9, 10, 27}  # hash, array, prog array, perf event array,
# per-CPU hash and array, LRU hash, LRU per-CPU hash, ring buffer
# Programs bcc would attach by their names in ways ImageBPF.attach_all does not.
OTHER_AUTOLOAD = (b"kprobe__", b"kretprobe__", b"kfunc__", b"kretfunc__", b"lsm__")
INSN = struct.Struct("<BBhi")  # code, dst/src registers, offset, immediate
_LD_IMM64 = 0x18
_PSEUDO_MAP_FD = 1


@dataclass(frozen=True, slots=True)
class TableSpec:
    name: bytes
    type: int
    key_size: int
    leaf_size: int
    max_entries: int
    flags: int
    key_desc: str
    leaf_desc: str


@dataclass(frozen=True, slots=True)
class ProgramSpec:
    name: bytes
    insns: bytes
    maps: tuple[tuple[int, int], ...]  # (instruction index, table index): the map fds to write


@dataclass(frozen=True, slots=True)
class ProbeImage:
    """What bcc's compile produced, without the fds of the process that compiled it."""

    license: bytes
    kern_version: int
    tables: tuple[TableSpec, ...]
    programs: tuple[ProgramSpec, ...]
    headers: HeaderSource  # what the text was compiled against
    made: float  # when (epoch seconds)

    def pack(self) -> bytes:
        return msgpack.packb(
            {
                "format": FORMAT,
                "license": self.license,
                "kern_version": self.kern_version,
                "tables": [
                    [t.name, t.type, t.key_size, t.leaf_size, t.max_entries, t.flags]
                    + [t.key_desc, t.leaf_desc]
                    for t in self.tables
                ],
                "programs": [[p.name, p.insns, [list(m) for m in p.maps]] for p in self.programs],
                "headers": [self.headers.kind, self.headers.path, self.headers.why],
                "made": self.made,
            },
            use_bin_type=True,
        )

    @classmethod
    def unpack(cls, raw: bytes) -> ProbeImage:
        """The image in ``raw``; ValueError when it is not one this version wrote."""
        try:
            doc = msgpack.unpackb(raw, raw=False, strict_map_key=True)
            if doc.get("format") != FORMAT:
                raise ValueError(f"format {doc.get('format')!r}, not {FORMAT}")
            tables = tuple(
                TableSpec(bytes(n), int(ty), int(k), int(v), int(m), int(f), str(kd), str(ld))
                for n, ty, k, v, m, f, kd, ld in doc["tables"]
            )
            programs = tuple(
                ProgramSpec(bytes(n), bytes(i), tuple((int(a), int(b)) for a, b in maps))
                for n, i, maps in doc["programs"]
            )
            image = cls(
                bytes(doc["license"]),
                int(doc["kern_version"]),
                tables,
                programs,
                HeaderSource(*(str(x) for x in doc["headers"])),
                float(doc["made"]),
            )
        except (ValueError, TypeError, KeyError, AttributeError, msgpack.UnpackException) as exc:
            raise ValueError(f"not a probe image ({exc})") from None
        image.check()
        return image

    def check(self) -> None:
        """ValueError unless every program is whole, is attached as we attach, and loads no
        map but this image's, each at an instruction that loads a map fd."""
        for table in self.tables:
            if table.type not in MAP_TYPES:
                raise ValueError(f"map {table.name!r} is of kind {table.type}")
        for program in self.programs:
            if program.name.startswith(OTHER_AUTOLOAD):
                raise ValueError(f"program {program.name!r} is attached some other way")
            if not program.insns or len(program.insns) % INSN.size:
                raise ValueError(f"program {program.name!r} is {len(program.insns)} bytes")
            loads = _pseudo_loads(program.insns)
            if loads is None or sorted(loads) != sorted(index for index, _ in program.maps):
                raise ValueError(f"program {program.name!r} loads something but its maps")
            if any(not 0 <= table < len(self.tables) for _, table in program.maps):
                raise ValueError(f"program {program.name!r} names a map the image lacks")


class LibBcc:
    """The few libbcc calls bcc's Python module does not declare (their C prototypes)."""

    def __init__(self, lib) -> None:
        def proto(name, restype, *args):
            return ct.CFUNCTYPE(restype, *args, use_errno=True)((name, lib))

        size, ptr, text = ct.c_size_t, ct.c_void_p, ct.c_char_p
        self.num_tables = proto("bpf_num_tables", size, ptr)
        self.table_name = proto("bpf_table_name", text, ptr, size)
        self.table_fd = proto("bpf_table_fd_id", ct.c_int, ptr, size)
        self.table_type = proto("bpf_table_type_id", ct.c_int, ptr, size)
        self.key_size = proto("bpf_table_key_size_id", size, ptr, size)
        self.leaf_size = proto("bpf_table_leaf_size_id", size, ptr, size)
        self.max_entries = proto("bpf_table_max_entries_id", size, ptr, size)
        self.flags = proto("bpf_table_flags_id", ct.c_int, ptr, size)
        self.key_desc = proto("bpf_table_key_desc_id", text, ptr, size)
        self.leaf_desc = proto("bpf_table_leaf_desc_id", text, ptr, size)
        self.create_map = proto(
            "bcc_create_map", ct.c_int, ct.c_int, text, ct.c_int, ct.c_int, ct.c_int, ct.c_int
        )
        self.prog_load = proto(
            "bcc_prog_load",
            ct.c_int,
            ct.c_int,  # program type
            text,  # name
            ptr,  # instructions
            ct.c_int,  # their length in bytes
            text,  # license
            ct.c_uint,  # kernel version
            ct.c_int,  # log level
            ptr,  # log buffer
            ct.c_uint,  # its size
        )


def capture(bcc, bpf, headers: HeaderSource) -> ProbeImage | None:
    """The image of a module bcc has just compiled, or None when it holds what we do not rebuild
    (what :meth:`ProbeImage.check` refuses, or a load of an fd that is none of its maps)."""
    lib, api, module = bcc.lib, LibBcc(bcc.lib), bpf.module
    tables, by_fd = [], {}
    for i in range(api.num_tables(module)):
        fd = api.table_fd(module, i)
        if fd < 0:
            return None
        tables.append(
            TableSpec(
                api.table_name(module, i),
                api.table_type(module, i),
                api.key_size(module, i),
                api.leaf_size(module, i),
                api.max_entries(module, i),
                api.flags(module, i),
                (api.key_desc(module, i) or b"").decode(),
                (api.leaf_desc(module, i) or b"").decode(),
            )
        )
        by_fd[fd] = i
    programs = []
    for i in range(lib.bpf_num_functions(module)):
        name = lib.bpf_function_name(module, i)
        insns = ct.string_at(
            lib.bpf_function_start(module, name), lib.bpf_function_size(module, name)
        )
        maps = _map_loads(insns, by_fd)
        if maps is None:
            return None
        programs.append(ProgramSpec(name, insns, maps))
    image = ProbeImage(
        lib.bpf_module_license(module),
        lib.bpf_module_kern_version(module),
        tuple(tables),
        tuple(programs),
        headers,
        time.time(),
    )
    try:
        image.check()
    except ValueError:
        return None
    return image


def _pseudo_loads(insns: bytes) -> list[int] | None:
    """The indexes of the 64-bit loads of a map fd; None if one loads any other kernel object."""
    found, index, count = [], 0, len(insns) // INSN.size
    while index < count:
        code, regs, _, _ = INSN.unpack_from(insns, index * INSN.size)
        if code != _LD_IMM64:
            index += 1
            continue
        if index + 1 >= count:
            return None  # half an instruction
        if regs >> 4 == _PSEUDO_MAP_FD:
            found.append(index)
        elif regs >> 4:
            return None  # a map value, a BTF id, a function: not rebuilt here
        index += 2
    return found


def _map_loads(insns: bytes, by_fd: dict[int, int]) -> tuple[tuple[int, int], ...] | None:
    """Each load of a map fd as (instruction, table); None if one loads anything else."""
    loads = _pseudo_loads(insns)
    if loads is None:
        return None
    found = []
    for index in loads:
        fd = INSN.unpack_from(insns, index * INSN.size)[3]
        if fd not in by_fd:
            return None
        found.append((index, by_fd[fd]))
    return tuple(found)
