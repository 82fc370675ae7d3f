"""Compiled probes kept on disk, so a later start on the same kernel skips bcc's compile.

For one probe text, set of flags, kernel and bcc, bcc's compile (~2 s of CPU) always yields the
same programs and maps.  That result is kept under ``/var/cache/gpuguard/probes`` (root's alone);
a start with the same key makes the maps, writes their fds into the instructions and loads the
programs itself, and the kernel's verifier checks them as it checks bcc's.  Python gets bcc's
own table and attach objects either way.  A result holding anything not rebuilt here is not
kept.  ``GPUGUARD_PROBE_CACHE`` names another directory, or ``off``.  The key, the format and
the safety rules: docs/agent.md, "The probe cache".
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes as ct
import errno
import hashlib
import json
import os
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import msgpack

from gpuguard.config.cache_file import read_cache_file, write_cache_file
from gpuguard.sources.ebpf.kernel_headers import HEADERS, HeaderSource, compile_with_headers

FORMAT = 1
DEFAULT_DIR = Path("/var/cache/gpuguard/probes")
ENV = "GPUGUARD_PROBE_CACHE"  # a directory, or "off"
KEEP = 16  # entries kept; a store removes the oldest beyond these
MAX_BYTES = 16 << 20
SUFFIX = ".probes"

# The map kinds an image may hold (linux/bpf.h): created here with bcc_create_map as bcc does.
MAP_TYPES = {1, 2, 3, 4, 5, 6, 9, 10, 27}  # hash, array, prog array, perf event array,
# per-CPU hash and array, LRU hash, LRU per-CPU hash, ring buffer
# Programs bcc would attach by their names in ways ImageBPF.attach_all does not.
OTHER_AUTOLOAD = (b"kprobe__", b"kretprobe__", b"kfunc__", b"kretfunc__", b"lsm__")
_INSN = struct.Struct("<BBhi")  # code, dst/src registers, offset, immediate
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
            if not program.insns or len(program.insns) % _INSN.size:
                raise ValueError(f"program {program.name!r} is {len(program.insns)} bytes")
            loads = _pseudo_loads(program.insns)
            if loads is None or sorted(loads) != sorted(index for index, _ in program.maps):
                raise ValueError(f"program {program.name!r} loads something but its maps")
            if any(not 0 <= table < len(self.tables) for _, table in program.maps):
                raise ValueError(f"program {program.name!r} names a map the image lacks")


class _Lib:
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
    """The image of a module bcc has just compiled, or None when it holds what we do not rebuild."""
    lib, api, module = bcc.lib, _Lib(bcc.lib), bpf.module
    tables, by_fd = [], {}
    for i in range(api.num_tables(module)):
        fd, kind = api.table_fd(module, i), api.table_type(module, i)
        if fd < 0 or kind not in MAP_TYPES:
            return None
        tables.append(
            TableSpec(
                api.table_name(module, i),
                kind,
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
        if name.startswith(OTHER_AUTOLOAD):
            return None
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
    image.check()
    return image


def _pseudo_loads(insns: bytes) -> list[int] | None:
    """The indexes of the 64-bit loads of a map fd; None if one loads any other kernel object."""
    found, index, count = [], 0, len(insns) // _INSN.size
    while index < count:
        code, regs, _, _ = _INSN.unpack_from(insns, index * _INSN.size)
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
        fd = _INSN.unpack_from(insns, index * _INSN.size)[3]
        if fd not in by_fd:
            return None
        found.append((index, by_fd[fd]))
    return tuple(found)


# -- loading an image -------------------------------------------------------------------------


class ImageModule:
    """Stands where bcc keeps its C module handle: bcc.table asks it the three questions a
    table asks at creation (kind, flags, size).  Anything else that would need a compiled
    module fails in ctypes (this is no pointer), never in C."""

    def __init__(self, image: ProbeImage) -> None:
        self.image = image

    def __bool__(self) -> bool:
        return True


class _TableLib:
    """libbcc as bcc.table sees it while a table of an image is made (:func:`_image_tables`)."""

    def __init__(self, real) -> None:
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)

    def _spec(self, module, map_id) -> TableSpec | None:
        return module.image.tables[map_id] if isinstance(module, ImageModule) else None

    def bpf_table_type_id(self, module, map_id):
        spec = self._spec(module, map_id)
        return spec.type if spec else self._real.bpf_table_type_id(module, map_id)

    def bpf_table_flags_id(self, module, map_id):
        spec = self._spec(module, map_id)
        return spec.flags if spec else self._real.bpf_table_flags_id(module, map_id)

    def bpf_table_max_entries_id(self, module, map_id):
        spec = self._spec(module, map_id)
        return spec.max_entries if spec else self._real.bpf_table_max_entries_id(module, map_id)


_TABLE_LIB_LOCK = threading.Lock()


@contextlib.contextmanager
def _image_tables(bcc_table):
    """bcc.table's ``lib`` answers for image maps meanwhile; every other call goes through."""
    with _TABLE_LIB_LOCK:
        real = bcc_table.lib
        bcc_table.lib = _TableLib(real)
        try:
            yield
        finally:
            bcc_table.lib = real


def image_bpf_class(bcc):
    """A bcc.BPF made from an image: the same tables, programs, attach and cleanup, no compile."""

    class ImageBPF(bcc.BPF):
        def __init__(self, image: ProbeImage) -> None:  # bcc.BPF.__init__ would compile
            for name in (
                "kprobe_fds", "uprobe_fds", "tracepoint_fds", "raw_tracepoint_fds",
                "kfunc_entry_fds", "kfunc_exit_fds", "lsm_fds", "perf_buffers",
                "open_perf_events", "funcs", "tables",
            ):  # fmt: skip
                setattr(self, name, {})
            self._ringbuf_manager = None
            self.tracefile = None
            self.debug = 0
            self.module = ImageModule(image)
            self._api = _Lib(bcc.lib)
            self._map_fds: list[int] = []
            self._programs = {p.name: p for p in image.programs}
            self._table_ids = {t.name: i for i, t in enumerate(image.tables)}
            atexit.register(self.cleanup)
            for table in image.tables:
                fd = self._api.create_map(
                    table.type,
                    table.name,
                    table.key_size,
                    table.leaf_size,
                    table.max_entries,
                    table.flags,
                )
                if fd < 0:
                    err = ct.get_errno()
                    self.close()
                    raise Exception(
                        f"Failed to create map {table.name.decode()}: {os.strerror(err)}"
                    )
                self._map_fds.append(fd)

        def load_func(self, func_name, prog_type, device=None, attach_type=-1):
            func_name = func_name.encode() if isinstance(func_name, str) else func_name
            if func_name in self.funcs:
                return self.funcs[func_name]
            program = self._programs.get(func_name)
            if program is None or device is not None or attach_type != -1:
                raise Exception(f"Unknown program {func_name!r}")
            insns = bytearray(program.insns)
            for index, table in program.maps:
                struct.pack_into("<i", insns, index * _INSN.size + 4, self._map_fds[table])
            buffer = (ct.c_ubyte * len(insns)).from_buffer(insns)
            image = self.module.image
            fd = self._api.prog_load(
                prog_type,
                func_name,
                buffer,
                len(insns),
                image.license,
                image.kern_version,
                0,
                None,
                0,
            )
            if fd < 0:
                err = ct.get_errno()
                if err == errno.EPERM:
                    raise Exception("Need super-user privileges to run")
                raise Exception(
                    f"Failed to load BPF program {func_name.decode()}: {os.strerror(err)}"
                )
            fn = bcc.BPF.Function(self, func_name, fd)
            self.funcs[func_name] = fn
            return fn

        def get_table(self, name, keytype=None, leaftype=None, reducer=None):
            name = name.encode() if isinstance(name, str) else name
            if name not in self._table_ids:
                raise KeyError(name)
            map_id = self._table_ids[name]
            spec = self.module.image.tables[map_id]
            keytype = keytype or bcc.BPF._decode_table_type(json.loads(spec.key_desc))
            leaftype = leaftype or bcc.BPF._decode_table_type(json.loads(spec.leaf_desc))
            with _image_tables(bcc.table):
                return bcc.table.Table(
                    self, map_id, self._map_fds[map_id], keytype, leaftype, name, reducer=reducer
                )

        def attach_all(self) -> None:
            """What bcc's automatic attach does for these programs, in the same order."""
            for name in self._programs:
                if name.startswith(b"tracepoint__"):
                    tracepoint = name[len(b"tracepoint__") :].replace(b"__", b":")
                    self.attach_tracepoint(tp=tracepoint, fn_name=name)
                elif name.startswith(b"raw_tracepoint__"):
                    self.attach_raw_tracepoint(tp=name[len(b"raw_tracepoint__") :], fn_name=name)

        def close(self) -> None:
            for name, fn in list(self.funcs.items()):
                os.close(fn.fd)
                del self.funcs[name]
            fds, self._map_fds = self._map_fds, []
            for fd in fds:
                os.close(fd)
            self.module = None

    return ImageBPF


# -- the cache on disk -------------------------------------------------------------------------


def cache_dir() -> Path | None:
    """Where images are kept (None: not kept, as when not root or ``GPUGUARD_PROBE_CACHE=off``)."""
    chosen = os.environ.get(ENV, "")
    if chosen.lower() == "off" or os.geteuid() != 0:
        return None
    return Path(chosen) if chosen else DEFAULT_DIR


def cache_key(bcc, text: str, cflags: list[str], offered: HeaderSource) -> str:
    """The name an image goes by: a digest of everything its instructions depend on."""
    uname = os.uname()
    parts = {
        "format": FORMAT,
        "bcc": [str(getattr(bcc, "__version__", "?")), _library_identity("libbcc.so")],
        "kernel": [uname.release, uname.version, uname.machine, _possible_cpus()],
        "headers": [offered.kind, offered.path, _file_identity(offered.path)],
        "cflags": list(cflags),
        "text": hashlib.sha256(text.encode()).hexdigest(),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _possible_cpus() -> str:
    try:
        return Path("/sys/devices/system/cpu/possible").read_text().strip()
    except OSError:
        return str(os.cpu_count())


def _file_identity(path: str) -> str:
    try:
        st = os.stat(path)
    except OSError:
        return ""
    return f"{st.st_size}:{st.st_mtime_ns}"


def _library_identity(stem: str) -> str:
    """The loaded library file named ``stem…`` (path, size, mtime), from this process's maps."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rstrip("\n").partition("/")[2]
                if path and f"/{stem}" in f"/{path}":
                    return f"/{path}:{_file_identity('/' + path)}"
    except OSError:
        pass
    return ""


@dataclass(frozen=True, slots=True)
class Loaded:
    """Probes ready to attach, and how they came to be."""

    bpf: object
    headers: HeaderSource
    cached: bool  # loaded from an image (True) or compiled by bcc now (False)
    note: str | None = None  # a cache that could not be read or written, in one line


def load_probes(bcc, text: str, cflags: list[str]) -> Loaded:
    """The probes in ``text``, not yet attached (``attach_all()`` does that): an image from the
    cache when one matches, else compiled by bcc now, and that kept for next time."""

    def compile_now():
        deferred = deferred_attach_bpf(bcc)
        return compile_with_headers(lambda: deferred(text=text.encode(), cflags=cflags))

    folder = cache_dir()
    if folder is None:
        bpf = compile_now()
        return Loaded(bpf, HEADERS.source, False)
    name = cache_key(bcc, text, cflags, HEADERS.first_offered()) + SUFFIX
    found = read_cache_file(folder, name, MAX_BYTES, "probe cache")
    note = found.note
    if found.content is not None:
        try:
            image = ProbeImage.unpack(found.content)
        except ValueError as exc:
            note = f"probe cache {folder / name} is unusable ({exc}); it will be rewritten"
        else:
            try:
                bpf = _loaded_image(bcc, image)
            except Exception as exc:  # noqa: BLE001 - bcc-style bare Exception: compile instead
                note = f"probe cache {folder / name} did not load ({exc}); compiled instead"
            else:
                return Loaded(bpf, _from_cache(image, folder / name), True, note)
    bpf = compile_now()
    headers = HEADERS.source
    if found.folder_usable:
        image = capture(bcc, bpf, headers)
        if image is not None:
            note = write_cache_file(folder, name, image.pack(), "probe cache") or note
            _prune(folder, keep=name)
    return Loaded(bpf, headers, False, note)


def _loaded_image(bcc, image: ProbeImage):
    """An ImageBPF with every program its name types already handed to the kernel, so a
    verifier that refuses one means a compile now, not a sensor that fails at attach."""
    bpf = image_bpf_class(bcc)(image)
    try:
        for program in image.programs:
            if program.name.startswith(b"tracepoint__"):
                bpf.load_func(program.name, bcc.BPF.TRACEPOINT)
            elif program.name.startswith(b"raw_tracepoint__"):
                bpf.load_func(program.name, bcc.BPF.RAW_TRACEPOINT)
    except BaseException:
        bpf.cleanup()
        raise
    return bpf


def deferred_attach_bpf(bcc):
    """bcc.BPF whose automatic attach of TRACEPOINT_PROBE/RAW_TRACEPOINT_PROBE
    programs waits for ``attach_all()``, so set-up can finish first."""

    class DeferredAttachBPF(bcc.BPF):
        def _trace_autoload(self) -> None:
            pass

        def attach_all(self) -> None:
            bcc.BPF._trace_autoload(self)

    return DeferredAttachBPF


def _from_cache(image: ProbeImage, path: Path) -> HeaderSource:
    made = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(image.made))
    why = f"{image.headers.why}; compiled {made}, loaded from the probe cache {path}"
    return HeaderSource(image.headers.kind, image.headers.path, why)


def _prune(folder: Path, keep: str) -> None:
    """Remove the oldest images beyond :data:`KEEP` (another kernel's, other flags')."""
    try:
        entries = [
            (entry.stat().st_mtime, entry)
            for entry in folder.iterdir()
            if entry.name.endswith(SUFFIX) and entry.name != keep and entry.is_file()
        ]
    except OSError:
        return
    for _, entry in sorted(entries, reverse=True)[KEEP - 1 :]:
        with contextlib.suppress(OSError):
            entry.unlink()
