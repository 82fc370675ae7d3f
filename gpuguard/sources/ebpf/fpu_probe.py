"""The FPU rounding-mode probe (probes/fpu.bpf.c): loads it where this kernel allows, reads its counts.

:meth:`FpuProbe.open` compiles the probe with the offsets of ``struct fpu.fpstate`` and
``struct fpstate.regs.xsave.i387.mxcsr`` read from the running kernel's BTF
(:mod:`gpuguard.sources.ebpf.btf`).  Where BTF, the tracepoint or BPF is missing it loads nothing
and says so in :attr:`FpuProbe.blind_spot` (one line, for the log and the status file):
RandomX's rounding-mode switching then goes unseen and the CPU-miner rules rely on the
rest.  :meth:`FpuProbe.counts` returns {tgid: :class:`FpuCounts`}, the totals so far.
"""

from __future__ import annotations

import ctypes
import os
import struct
import time
from dataclasses import dataclass

from gpuguard.sources.ebpf.btf import Btf, BtfError
from gpuguard.sources.ebpf.probe_source import probe_dir

SOURCE = "fpu.bpf.c"
TRACEPOINT = "x86_fpu/x86_fpu_regs_deactivated"
_TRACEFS = ("/sys/kernel/tracing/events", "/sys/kernel/debug/tracing/events")
BLIND_PREFIX = "SSE rounding-mode switching (RandomX) unseen"


@dataclass(frozen=True, slots=True)
class FpuCounts:
    """One process's totals (``struct gg_fpu_rounding``)."""

    samples: int
    nondefault: int
    changes: int
    span_s: float  # first to latest counted look


def fpu_offsets(btf: Btf) -> dict[str, int]:
    """The compiler defines the probe needs, from BTF."""
    return {
        "GG_FPU_FPSTATE_OFF": btf.path_offset("fpu", "fpstate"),
        "GG_FPSTATE_MXCSR_OFF": btf.path_offset("fpstate", "regs", "xsave", "i387", "mxcsr"),
    }


_NR_BPF = 321  # x86_64
_BPF_OBJ_GET_INFO_BY_FD = 15


def _prog_info(fd: int, size: int) -> bytes | None:
    """struct bpf_prog_info of a program fd (bpf(2) BPF_OBJ_GET_INFO_BY_FD)."""
    libc = ctypes.CDLL(None, use_errno=True)
    info = ctypes.create_string_buffer(size)
    attr = struct.pack("<IIQ", fd, size, ctypes.addressof(info)) + bytes(112)
    attr_buf = ctypes.create_string_buffer(attr, len(attr))
    if libc.syscall(_NR_BPF, _BPF_OBJ_GET_INFO_BY_FD, attr_buf, len(attr)) != 0:
        return None
    return info.raw


def _tracepoint_present() -> bool:
    return any(os.path.isdir(f"{root}/{TRACEPOINT}") for root in _TRACEFS)


class FpuProbe:
    """The loaded probe, or the reason it is not (``blind_spot``)."""

    def __init__(self, bpf=None, blind_spot: str = "", defines: dict[str, int] | None = None):
        self._bpf = bpf
        self.blind_spot = blind_spot
        self.defines = defines or {}
        self.load_seconds = 0.0

    @property
    def loaded(self) -> bool:
        return self._bpf is not None

    @classmethod
    def open(cls, bcc=None, btf_path: str | None = None) -> FpuProbe:
        """Load the probe; never raises (a probe that cannot load is a declared blind spot)."""
        started = time.perf_counter()
        if os.uname().machine not in ("x86_64", "i686", "i386"):
            return cls(blind_spot=f"{BLIND_PREFIX}: not an x86 CPU")
        if not _tracepoint_present():
            return cls(blind_spot=f"{BLIND_PREFIX}: this kernel has no {TRACEPOINT} tracepoint")
        try:
            btf = Btf.load(btf_path) if btf_path else Btf.load()
            defines = fpu_offsets(btf)
        except BtfError as exc:
            return cls(
                blind_spot=f"{BLIND_PREFIX}: no usable kernel BTF ({exc}); "
                "a kernel built with CONFIG_DEBUG_INFO_BTF=y provides it"
            )
        if bcc is None:
            try:
                import bcc
            except ImportError:
                return cls(blind_spot=f"{BLIND_PREFIX}: bcc is not installed")
        probes = probe_dir()
        try:
            bpf = bcc.BPF(
                src_file=str(probes / SOURCE).encode(),
                cflags=[f"-I{probes}", "-Wno-comment"]
                + [f"-D{name}={value}" for name, value in defines.items()],
            )
        except Exception as exc:  # noqa: BLE001 - bcc raises bare Exception for compile/load/attach errors
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            return cls(blind_spot=f"{BLIND_PREFIX}: the probe did not load ({first})")
        probe = cls(bpf, defines=defines)
        probe.load_seconds = time.perf_counter() - started
        return probe

    def counts(self) -> dict[int, FpuCounts]:
        """{tgid: totals} of every process seen leaving round-to-nearest (live or recently gone)."""
        if self._bpf is None:
            return {}
        out: dict[int, FpuCounts] = {}
        try:
            items = list(self._bpf[b"fpu_rounding"].items())
        except Exception:  # noqa: BLE001 - bcc raises bare Exception when a map read fails
            return out
        for key, value in items:
            out[key.value] = FpuCounts(
                value.samples,
                value.nondefault,
                value.changes,
                max(0.0, (value.last_ns - value.first_ns) / 1e9),
            )
        return out

    def forget(self, tgids: list[int]) -> None:
        """Drop the entries of processes that are gone (the map is LRU too: this keeps it lean)."""
        if self._bpf is None:
            return
        table = self._bpf[b"fpu_rounding"]
        for tgid in tgids:
            try:
                del table[table.Key(tgid)]
            except KeyError:
                pass

    def run_stats(self) -> tuple[int, int] | None:
        """(runs, nanoseconds spent) of the probe program since load, from the kernel's BPF
        statistics (counted only while kernel.bpf_stats_enabled is 1); None if unreadable."""
        if self._bpf is None:
            return None
        try:
            fds = [f.fd for f in self._bpf.funcs.values()]
            btf = Btf.load()
            at_time = btf.path_offset("bpf_prog_info", "run_time_ns")
            at_count = btf.path_offset("bpf_prog_info", "run_cnt")
            size = btf.size_of("bpf_prog_info")
        except (BtfError, AttributeError):
            return None
        runs = spent = 0
        for fd in fds:
            info = _prog_info(fd, size)
            if info is None:
                return None
            runs += int.from_bytes(info[at_count : at_count + 8], "little")
            spent += int.from_bytes(info[at_time : at_time + 8], "little")
        return runs, spent

    def close(self) -> None:
        if self._bpf is not None:
            self._bpf.cleanup()
            self._bpf = None
