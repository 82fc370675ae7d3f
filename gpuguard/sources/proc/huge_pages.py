"""Huge pages as /proc and /sys show them: per process (no probe needed) and host-wide.

* :func:`process_hugetlb`: the hugetlb memory a process maps and its largest page
  size.  ``HugetlbPages`` in /proc/PID/status is a counter the kernel keeps (the
  same figure as Private_Hugetlb + Shared_Hugetlb in smaps_rollup, which walks
  the page tables to get it), so every examined process costs one small read;
  /proc/PID/smaps is read only for the few that map hugetlb pages, for the page
  size (1 GiB pages are a RandomX sign).  Transparent huge pages (AnonHugePages)
  are not counted: ordinary programs get them without asking.
* :func:`read_host_tuning`: the host state a RandomX miner leaves as root: the
  msr module loaded with ``allow_writes=on`` (``modprobe msr allow_writes=on``
  passes it at load time, no file write for the sensor to see) and huge pages
  reserved per size.  ``gpuguard.detect.host.tuning_checks`` judges it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

KIB = 1024
_MAX_SMAPS_BYTES = 8 << 20  # a process with this many mappings is read in part


def _status_kib(pid: int, key: bytes, proc_root: str) -> int | None:
    try:
        with open(f"{proc_root}/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return 0  # no such line: a kernel without hugetlb


MAX_MAPPINGS = 16  # hugetlb mappings kept per process


def hugetlb_mappings(pid: int, proc_root: str) -> list[tuple[int, int]] | None:
    """(mapping size, page size) in bytes of the mappings that hold hugetlb pages (smaps)."""
    try:
        with open(f"{proc_root}/{pid}/smaps", "rb") as f:
            data = f.read(_MAX_SMAPS_BYTES)
    except OSError:
        return None
    out: list[tuple[int, int]] = []
    size_kib = page_kib = 0
    counted = False
    for line in data.split(b"\n"):
        if line.startswith(b"Size:"):
            size_kib, counted = int(line.split()[1]), False
        elif line.startswith(b"KernelPageSize:"):
            page_kib = int(line.split()[1])
        elif line.startswith((b"Private_Hugetlb:", b"Shared_Hugetlb:")):
            parts = line.split()
            if len(parts) > 1 and parts[1] != b"0" and not counted and len(out) < MAX_MAPPINGS:
                out.append((size_kib * KIB, page_kib * KIB))
                counted = True
    return out


def status_hugetlb_kib(status: bytes) -> int:
    """HugetlbPages (KiB) from the text of /proc/PID/status already read (0: none, or no such line)."""
    at = status.find(b"\nHugetlbPages:")
    if at < 0:
        return 0
    try:
        return int(status[at:].split(None, 3)[1])
    except (ValueError, IndexError):
        return 0


def process_hugetlb(
    pid: int, proc_root: str = "/proc", status_kib: int | None = None
) -> tuple[int | None, int | None, list[tuple[int, int]]]:
    """(hugetlb bytes mapped, largest hugetlb page size in bytes or None, the (size, page size) of
    each mapping holding them); (None, None, []) if unreadable.  ``status_kib``: HugetlbPages
    from a status file the caller already read (smaps is read only when it is not 0)."""
    kib = status_kib if status_kib is not None else _status_kib(pid, b"HugetlbPages:", proc_root)
    if kib is None:
        return None, None, []
    if kib == 0:
        return 0, None, []
    mappings = hugetlb_mappings(pid, proc_root) or []
    largest = max((page for _size, page in mappings), default=0)
    return kib * KIB, largest or None, mappings


@dataclass(slots=True)
class HostTuning:
    """Host-wide CPU-miner tuning state (paths under ``root``)."""

    msr_allow_writes: str | None = None  # "on" / "off" / "default"; None: msr module not loaded
    nr_hugepages: int | None = None  # /proc/sys/vm/nr_hugepages (default-size pages)
    reserved: dict[int, int] = field(
        default_factory=dict
    )  # page size in bytes -> pages reserved (> 0 only)
    sources: dict[str, str] = field(
        default_factory=dict
    )  # path -> value of what is set (msr, counts > 0)


MSR_ALLOW_WRITES = "/sys/module/msr/parameters/allow_writes"
NR_HUGEPAGES = "/proc/sys/vm/nr_hugepages"
HUGEPAGES_DIR = "/sys/kernel/mm/hugepages"


def _read_text(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(256).decode("ascii", "replace").strip()
    except OSError:
        return None


def _page_size_of(directory: str) -> int | None:
    """``hugepages-1048576kB`` -> 1 GiB in bytes."""
    if not (directory.startswith("hugepages-") and directory.endswith("kB")):
        return None
    digits = directory[len("hugepages-") : -2]
    return int(digits) * KIB if digits.isdigit() else None


def read_host_tuning(root: str = "/") -> HostTuning:
    """Read the msr module's allow_writes and the huge-page reservations (unreadable parts stay None)."""
    base = root.rstrip("/")
    tuning = HostTuning()
    value = _read_text(base + MSR_ALLOW_WRITES)
    if value is not None:
        tuning.msr_allow_writes = value
        tuning.sources[MSR_ALLOW_WRITES] = value
    value = _read_text(base + NR_HUGEPAGES)
    if value is not None and value.isdigit():
        tuning.nr_hugepages = int(value)
        if tuning.nr_hugepages:
            tuning.sources[NR_HUGEPAGES] = value
    try:
        entries = sorted(os.listdir(base + HUGEPAGES_DIR))
    except OSError:
        entries = []
    for entry in entries:
        size = _page_size_of(entry)
        path = f"{HUGEPAGES_DIR}/{entry}/nr_hugepages"
        count = _read_text(base + path)
        if size is None or count is None or not count.isdigit():
            continue
        if int(count) > 0:
            tuning.reserved[size] = int(count)
            tuning.sources[path] = count
    return tuning
