"""The FPU rounding-mode probe (probes/fpu.bpf.c): loads it where this kernel allows, reads its counts.

:meth:`FpuProbe.open` compiles the probe with the offsets of ``struct fpu.fpstate``,
``struct fpstate.regs.xsave.i387.mxcsr`` and ``struct task_struct.__state`` read from the
running kernel's BTF (:mod:`gpuguard.sources.ebpf.btf`).  Where BTF, the tracepoint or BPF is
missing it loads nothing and says so in :attr:`FpuProbe.blind_spot` (one line, for the log,
the status file and scan's report): RandomX's rounding modes then go unseen and the CPU-miner
rules rely on the rest.  The kernel keeps one entry per thread; :meth:`FpuProbe.counts` sums
them into {tgid: ``FpuCounts``}, the totals so far (gpuguard/events/rounding_modes.py defines
them and reads the pattern in them).
"""

from __future__ import annotations

import ctypes
import os
import struct
import time
from dataclasses import dataclass, field

from gpuguard.errors import GpuguardError
from gpuguard.events.rounding_modes import SLEEPLESS_MIN_LOOKS, SLEEPLESS_SHARE, FpuCounts
from gpuguard.sources.ebpf.btf import Btf, BtfError
from gpuguard.sources.ebpf.probe_cache import load_probes
from gpuguard.sources.ebpf.probe_source import probe_text
from gpuguard.sources.proc.capabilities import can_load_bpf, effective_capabilities

SOURCE = "fpu.bpf.c"
TRACEPOINT = "x86_fpu/x86_fpu_regs_deactivated"
_TP = TRACEPOINT.replace("/", ":").encode()  # as bcc names it
_FN = b"tracepoint__" + TRACEPOINT.replace("/", "__").encode()  # TRACEPOINT_PROBE's function
_TRACEFS = ("/sys/kernel/tracing/events", "/sys/kernel/debug/tracing/events")
BLIND_PREFIX = "SSE rounding-mode switching (RandomX) unseen"


def fpu_offsets(btf: Btf) -> dict[str, int]:
    """The compiler defines the probe needs, from BTF."""
    try:
        state = btf.path_offset("task_struct", "__state")
    except BtfError:
        state = btf.path_offset("task_struct", "state")  # named so before Linux 5.14
    return {
        "GG_FPU_FPSTATE_OFF": btf.path_offset("fpu", "fpstate"),
        "GG_FPSTATE_MXCSR_OFF": btf.path_offset("fpstate", "regs", "xsave", "i387", "mxcsr"),
        "GG_TASK_STATE_OFF": state,
    }


def _layout_problem(leaf) -> str:
    """What is wrong with bcc's class of ``struct gg_fpu_rounding`` for this reader ('' if
    nothing): the one definition is the header's, this only checks that it is the one read."""
    fields = dict(getattr(leaf, "_fields_", ()))
    for name, length in (("modes", 4), ("next", 16)):
        kind = fields.get(name)
        if kind is None or getattr(kind, "_length_", None) != length:
            return f"struct gg_fpu_rounding has no {name}[{length}]"
    missing = {"first_ns", "last_ns", "preempted", "stopped", "tgid"} - set(fields)
    return f"struct gg_fpu_rounding lacks {sorted(missing)}" if missing else ""


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


@dataclass(slots=True)
class _ProcessSum:
    """The running totals of one process's threads while :meth:`FpuProbe.counts` walks the map."""

    first_ns: int
    last_ns: int
    modes: list[int] = field(default_factory=lambda: [0] * 4)
    transitions: list[int] = field(default_factory=lambda: [0] * 16)
    preempted: int = 0
    stopped: int = 0
    sleepless: int = 0
    keys: list = field(default_factory=list)

    def add(self, key, thread) -> None:
        """One thread's entry (``struct gg_fpu_rounding``) under map key ``key``."""
        self.keys.append(key)
        for i in range(4):
            self.modes[i] += thread.modes[i]
        for i in range(16):
            self.transitions[i] += thread.next[i]
        self.preempted += thread.preempted
        self.stopped += thread.stopped
        self.first_ns = min(self.first_ns, thread.first_ns)
        self.last_ns = max(self.last_ns, thread.last_ns)
        looks = sum(thread.modes)
        if looks >= SLEEPLESS_MIN_LOOKS:
            self.sleepless += looks - thread.preempted - thread.stopped <= SLEEPLESS_SHARE * looks

    def counts(self) -> FpuCounts:
        return FpuCounts(
            tuple(self.modes),
            tuple(self.transitions),
            self.preempted,
            self.stopped,
            len(self.keys),
            max(0.0, (self.last_ns - self.first_ns) / 1e9),
            self.sleepless,
        )


class FpuProbe:
    """The loaded probe, or the reason it is not (``blind_spot``)."""

    def __init__(self, bpf=None, blind_spot: str = "", defines: dict[str, int] | None = None):
        self._bpf = bpf
        self.blind_spot = blind_spot
        self.defines = defines or {}
        self.load_seconds = 0.0
        self._keys_of: dict[int, list] = {}  # tgid -> its threads' map keys, at the last walk
        self.attaches = 0  # set_attached(True) that attached it again
        self.attach_failures = 0

    @property
    def loaded(self) -> bool:
        return self._bpf is not None

    @classmethod
    def open(cls, bcc=None, btf_path: str | None = None) -> FpuProbe:
        """Load the probe; never raises (a probe that cannot load is a declared blind spot)."""
        started = time.perf_counter()
        if os.uname().machine not in ("x86_64", "i686", "i386"):
            return cls(blind_spot=f"{BLIND_PREFIX}: not an x86 CPU")
        if not can_load_bpf(effective_capabilities()):
            return cls(
                blind_spot=f"{BLIND_PREFIX}: loading the probe needs CAP_BPF and CAP_PERFMON "
                "(or CAP_SYS_ADMIN)"
            )
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
        cflags = ["-Wno-comment"] + [f"-D{k}={v}" for k, v in defines.items()]
        try:
            bpf = load_probes(bcc, probe_text(SOURCE), cflags).bpf
        except GpuguardError as exc:  # no header source at all
            return cls(blind_spot=f"{BLIND_PREFIX}: {exc.one_line()}")
        except Exception as exc:  # noqa: BLE001 - bcc raises bare Exception for compile/load/attach errors
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            return cls(blind_spot=f"{BLIND_PREFIX}: the probe did not load ({first})")
        problem = _layout_problem(bpf[b"schema_fpu_rounding"].Leaf)
        if problem:
            bpf.cleanup()
            return cls(blind_spot=f"{BLIND_PREFIX}: {problem} (a stale probes/gpuguard.h?)")
        try:
            bpf.attach_all()
        except Exception as exc:  # noqa: BLE001 - bcc raises bare Exception when attaching fails
            bpf.cleanup()
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            return cls(blind_spot=f"{BLIND_PREFIX}: the probe did not attach ({first})")
        probe = cls(bpf, defines=defines)
        probe.load_seconds = time.perf_counter() - started
        return probe

    @property
    def attached(self) -> bool:
        """Whether the program runs at context switches now (it is attached when loaded)."""
        return self._bpf is not None and _TP in self._bpf.tracepoint_fds

    def set_attached(self, on: bool) -> bool:
        """Attach or detach the loaded program (its map and counts stay); returns
        :attr:`attached`.  Detached it costs the host's context switches nothing."""
        if self._bpf is None or on == self.attached:
            return self.attached
        try:
            if on:
                self._bpf.attach_tracepoint(tp=_TP, fn_name=_FN)
                self.attaches += 1
            else:
                self._bpf.detach_tracepoint(_TP)
        except Exception:  # noqa: BLE001 - bcc raises bare Exception when (de)attaching fails
            self.attach_failures += 1
        return self.attached

    def counts(self) -> dict[int, FpuCounts]:
        """{tgid: totals} of every process with a thread seen leaving round-to-nearest (live or
        recently gone).  The walk's keys are kept for :meth:`forget`."""
        if self._bpf is None:
            return {}
        try:
            items = list(self._bpf[b"fpu_rounding"].items())
        except Exception:  # noqa: BLE001 - bcc raises bare Exception when a map read fails
            return {}
        sums: dict[int, _ProcessSum] = {}
        for key, v in items:
            acc = sums.get(v.tgid)
            if acc is None:
                acc = sums[v.tgid] = _ProcessSum(first_ns=v.first_ns, last_ns=v.last_ns)
            acc.add(key, v)
        self._keys_of = {tgid: acc.keys for tgid, acc in sums.items()}
        return {tgid: acc.counts() for tgid, acc in sums.items()}

    def forget(self, tgids: list[int]) -> None:
        """Drop the entries of processes that are gone, as the last :meth:`counts` found them (the
        map is LRU too: this keeps it lean)."""
        if self._bpf is None or not tgids:
            return
        table = self._bpf[b"fpu_rounding"]
        for tgid in tgids:
            for key in self._keys_of.pop(tgid, ()):
                try:
                    del table[key]
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
