"""A bcc.BPF made from a probe image instead of bcc's compile.

The maps are created, their fds written into the instructions and the programs handed to the
kernel (whose verifier checks them as it checks bcc's output); bcc's own table, attach and
cleanup code works on top, as on a compiled module.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes as ct
import errno
import json
import os
import struct
import threading

from gpuguard.sources.ebpf.probe_image import INSN, LibBcc, ProbeImage, TableSpec


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
            self._api = LibBcc(bcc.lib)
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
                struct.pack_into("<i", insns, index * INSN.size + 4, self._map_fds[table])
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


def loaded_image(bcc, image: ProbeImage):
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
