"""Huge pages reserved for a test, counted so that tests beside each other compose.

Each reservation adds its pages to ``vm.nr_hugepages`` and takes the same number away when
it ends, under one lock every test run on the host shares (a file lock: two workers, or two
checkouts, never interleave a read and its write).  Restoring the count read before, as each
test used to, gave back another test's pages if the two overlapped.

:func:`pool_held` keeps the count from moving while a test reads it (a test that asserts the
host's whole count).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path

from tests.support.locks import host_lock

NR_HUGEPAGES = Path("/proc/sys/vm/nr_hugepages")
LOCK = Path("/run/gpuguard-test-hugepages.lock")


def pool_held() -> AbstractContextManager[None]:
    """No reservation starts or ends on this host while inside."""
    return host_lock(LOCK)


def _change(pages: int, locked: bool) -> int:
    """Add ``pages`` (negative: give back) to the count; return how many it moved by."""
    with nullcontext() if locked else pool_held():
        before = int(NR_HUGEPAGES.read_text())
        NR_HUGEPAGES.write_text(str(max(0, before + pages)))
        return int(NR_HUGEPAGES.read_text()) - before


_open = [0]  # reservations open in this process (one test at a time per process)


def reservation_open() -> bool:
    """Whether the running test holds a reservation (its workloads may map huge pages)."""
    return _open[0] > 0


@contextmanager
def reserved_huge_pages(pages: int, *, pool_is_held: bool = False) -> Iterator[None]:
    """``pages`` more default-size (2 MiB) huge pages while inside; given back after (stop the
    processes that map them first).  ``pool_is_held``: the caller is inside :func:`pool_held`.
    The workloads of a test map only what it reserved (tests/support/load.py)."""
    granted = _change(pages, locked=pool_is_held)
    _open[0] += 1
    try:
        assert granted >= pages, (
            f"the kernel gave {granted} of {pages} huge pages (memory too fragmented?)"
        )
        yield
    finally:
        _open[0] -= 1
        _change(-max(granted, 0), locked=pool_is_held)
