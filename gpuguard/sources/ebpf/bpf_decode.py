"""Kernel event structs (as bcc's ctypes classes) -> typed model events.

The ctypes classes come from the loaded program (``schema_*`` maps), never
from a hand-written mirror; this module only reads their fields.  A record
whose kind is unknown or whose size does not match its struct is rejected
with :class:`MalformedEvent`, which the sensor counts instead of crashing.
"""

from __future__ import annotations

import ctypes as ct
import ipaddress
import socket
import time

from gpuguard.escape import decode_c_string
from gpuguard.events.abi import OPEN_RELATIVE, EventKind, HugeSource, device_class_name
from gpuguard.events.model import Connect, Event, Exec, Exit, GpuOpen, HugeAlloc, NetPayload


class MalformedEvent(ValueError):
    """A ring-buffer record that does not match the probes' layout."""


def default_huge_page_size(meminfo: str = "/proc/meminfo") -> int:
    """The host's default huge page size in bytes (``Hugepagesize``), what a MAP_HUGETLB
    without MAP_HUGE_* bits gets; 2 MiB when it cannot be read."""
    try:
        with open(meminfo, "rb") as f:
            for line in f:
                if line.startswith(b"Hugepagesize:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 2 << 20


def _no_event(_raw) -> None:
    """A wake-up record (GG_KIND_WAKE: the exec filter kept an exec while user space slept)."""
    return None


def boot_to_epoch_offset() -> float:
    """Seconds to add to CLOCK_BOOTTIME (bpf_ktime_get_boot_ns) to get epoch time."""
    return time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)


class EventDecoder:
    """Decodes raw records into model events, given the program's struct classes."""

    def __init__(
        self, struct_classes: dict[int, type[ct.Structure]], header_class: type[ct.Structure]
    ):
        self._classes = struct_classes
        self._header = header_class
        self._header_size = ct.sizeof(header_class)
        self._offset = boot_to_epoch_offset()
        self._decoders = {
            EventKind.GPU_OPEN: self._gpu_open,
            EventKind.CONNECT: self._connect,
            EventKind.NET_PAYLOAD: self._net_payload,
            EventKind.EXEC: self._exec,
            EventKind.EXIT: self._exit,
            EventKind.HUGE_ALLOC: self._huge_alloc,
            EventKind.WAKE: _no_event,
        }
        self._default_huge_page = default_huge_page_size()
        for kind, cls in struct_classes.items():
            # Size self-check: the header's size field must match what bcc says.
            if ct.sizeof(cls) < self._header_size:
                raise MalformedEvent(f"struct for kind {kind} is smaller than the header")

    def decode(self, data: int, size: int) -> Event | None:
        """``data`` is the address bcc passes to a ring/perf buffer callback; None for a record
        that only wakes the reader (GG_KIND_WAKE)."""
        if size < self._header_size:
            raise MalformedEvent(
                f"record of {size} bytes is shorter than the {self._header_size}-byte header"
            )
        header = ct.cast(data, ct.POINTER(self._header)).contents
        cls = self._classes.get(header.kind)
        if cls is None:
            raise MalformedEvent(f"unknown event kind {header.kind}")
        expected = ct.sizeof(cls)
        if header.size != expected or size < expected:
            raise MalformedEvent(
                f"kind {header.kind}: header says {header.size} bytes, record has {size}, struct has {expected}"
            )
        raw = ct.cast(data, ct.POINTER(cls)).contents
        return self._decoders[header.kind](raw)

    def _common(self, hdr) -> dict:
        return {
            "time": hdr.time_ns / 1e9 + self._offset,
            "pid": hdr.tgid,
            "tid": hdr.pid,
            "uid": hdr.uid,
            "gid": hdr.gid,
            "cgroup_id": hdr.cgroup_id,
            "comm": decode_c_string(bytes(hdr.comm)),
        }

    def _gpu_open(self, raw) -> GpuOpen:
        return GpuOpen(
            **self._common(raw.hdr),
            path=decode_c_string(bytes(raw.path)),
            device_class=device_class_name(raw.device_class),
            fd=raw.fd,
            flags=raw.open_flags,
            relative=bool(raw.gg_flags & OPEN_RELATIVE),
        )

    def _connect(self, raw) -> Connect:
        addr = bytes(raw.addr)
        if raw.family == socket.AF_INET:
            family, address = "ipv4", str(ipaddress.IPv4Address(addr[:4]))
        else:
            family, address = "ipv6", str(ipaddress.IPv6Address(addr))
        return Connect(
            **self._common(raw.hdr),
            family=family,
            address=address,
            port=raw.port,
            fd=raw.fd,
            result=raw.result,
        )

    def _net_payload(self, raw) -> NetPayload:
        n = min(raw.len, len(raw.data))
        return NetPayload(
            **self._common(raw.hdr),
            fd=raw.fd,
            seq=raw.seq,
            data=ct.string_at(ct.addressof(raw.data), n),
            truncated=raw.orig_len > n,
        )

    def exec_record(self, raw) -> Exec:
        """An exec record read from a map (the exec filter's ``exec_pending``), not the ring."""
        return self._exec(raw)

    def _exec(self, raw) -> Exec:
        return Exec(
            **self._common(raw.hdr),
            filename=decode_c_string(bytes(raw.filename)),
            ppid=raw.ppid,
            exit_gen=raw.exit_gen,
        )

    def _exit(self, raw) -> Exit:
        return Exit(**self._common(raw.hdr), exit_code=raw.exit_code)

    def _huge_alloc(self, raw) -> HugeAlloc:
        try:
            source = HugeSource(raw.source).name.lower()
        except ValueError:
            source = f"unknown-{raw.source}"
        return HugeAlloc(
            **self._common(raw.hdr),
            source=source,
            length=raw.length,
            page_size=(1 << raw.page_shift) if raw.page_shift else self._default_huge_page,
            flags=raw.flags,
        )
