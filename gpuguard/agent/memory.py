"""The agent's own memory: freed heap and the compiler's code pages handed back after start-up.

Compiling the probes maps LLVM and clang (~80 MB of code pages on Debian's bcc)
and leaves ~25 MB of freed heap behind.  Neither is needed once the probes are
loaded: :func:`return_freed_memory` gives the free heap back (glibc keeps it
mapped otherwise) and :func:`release_compiler_pages` asks the kernel to reclaim
the compiler's file-backed pages (``MADV_PAGEOUT``: a page that is needed
again, say for a response probe compiled later, is simply read back from the
page cache or the file).  Reclaim never changes what a page holds, so it is
safe for every mapping of those libraries; on a kernel without
``MADV_PAGEOUT`` (< 5.4) nothing happens.
"""

from __future__ import annotations

import ctypes
import errno

MADV_DONTNEED = 4
MADV_PAGEOUT = 21
COMPILER_LIBRARIES = ("libLLVM", "libclang")


def return_freed_memory() -> None:
    """Give freed heap back to the kernel (glibc keeps it mapped otherwise), so RSS shows what is in use."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc: nothing to do


def compiler_mappings(maps_text: str) -> list[tuple[int, int]]:
    """(start, length) of every mapping of the compiler libraries in a /proc/PID/maps text."""
    ranges = []
    for line in maps_text.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and any(lib in fields[5] for lib in COMPILER_LIBRARIES):
            start, end = (int(x, 16) for x in fields[0].split("-"))
            ranges.append((start, end - start))
    return ranges


def _unwritten_mappings(smaps_text: str) -> set[int]:
    """Start addresses of compiler mappings that are read-only and hold no private (written) page."""
    clean, start, readonly = set(), None, False
    for line in smaps_text.splitlines():
        fields = line.split()
        if fields and "-" in fields[0] and not fields[0].endswith(":"):
            start = None
            if len(fields) >= 6 and any(lib in fields[5] for lib in COMPILER_LIBRARIES):
                start = int(fields[0].split("-")[0], 16)
                readonly = "w" not in fields[1]
        elif start is not None and fields[:1] == ["Anonymous:"]:
            if readonly and fields[1] == "0":
                clean.add(start)
    return clean


def release_compiler_pages() -> int:
    """Ask the kernel to reclaim this process's LLVM/clang pages; returns the bytes asked for.

    A read-only mapping with no private page only maps the file: dropping it from this process
    (MADV_DONTNEED) loses nothing, and works while other processes map the library too.  Any
    other mapping gets MADV_PAGEOUT, which never changes what a page holds.
    """
    try:
        with open("/proc/self/maps") as f:
            ranges = compiler_mappings(f.read())
        with open("/proc/self/smaps") as f:
            unwritten = _unwritten_mappings(f.read())
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return 0
    madvise = libc.madvise
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    asked = 0
    for start, length in ranges:
        advice = MADV_DONTNEED if start in unwritten else MADV_PAGEOUT
        if madvise(start, length, advice) == 0:
            asked += length
        elif ctypes.get_errno() != errno.EINVAL:
            continue  # EINVAL: this kernel has no MADV_PAGEOUT; the others still apply
    return asked
