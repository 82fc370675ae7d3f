"""Rule signals of huge-page memory: the hugetlb requests the sensor saw and what /proc shows."""

from __future__ import annotations

from gpuguard.correlate.state import ProcessState
from gpuguard.detect.signals.definition import signal

# The sensor's requests (mmap MAP_HUGETLB / shmget SHM_HUGETLB) and what /proc shows it
# maps (hugetlb only: transparent huge pages are no sign of anything).


@signal(
    "huge_alloc_bytes",
    "number",
    "memory",
    "largest hugetlb allocation: one request the sensor saw (mmap MAP_HUGETLB / shmget "
    "SHM_HUGETLB), or all it maps now (HugetlbPages in /proc/PID/status); RandomX: 256 MiB, "
    "~2 GiB; transparent huge pages do not count",
    reads=("facts.hugetlb_bytes", "huge_alloc_bytes"),
)
def huge_alloc_bytes(s: ProcessState, now: float) -> int | None:
    mapped = s.facts.hugetlb_bytes if s.facts is not None else None
    largest = max(s.huge_alloc_bytes, mapped or 0)
    return largest or None


@signal(
    "huge_page_size",
    "number",
    "memory",
    "largest huge page size (bytes) it asked for or maps (1 GiB: RandomX's 1gb-pages)",
    reads=("facts.hugetlb_page_size", "huge_page_size"),
)
def huge_page_size(s: ProcessState, now: float) -> int | None:
    mapped = s.facts.hugetlb_page_size if s.facts is not None else None
    largest = max(s.huge_page_size, mapped or 0)
    return largest or None


# RandomX's own allocations: the 256 MiB cache and the dataset (2 GiB + 33554368 bytes),
# as asked for or rounded up to 2 MiB pages; with 1 GiB pages the cache takes one page and
# the dataset three.  A JVM heap or database buffers in huge pages have the size they were
# configured with, a round 256 MiB being the one that collides.
RANDOMX_LENGTHS = frozenset({256 << 20, 2181038016, 2080 << 20})
RANDOMX_GIB_PAGE_LENGTHS = frozenset({1 << 30, 3 << 30})


def _randomx_length(length: int, page_size: int) -> bool:
    return length in RANDOMX_LENGTHS or (
        page_size >= 1 << 30 and length in RANDOMX_GIB_PAGE_LENGTHS
    )


@signal(
    "huge_alloc_randomx_shape",
    "bool",
    "memory",
    "a huge-page request (sensor) or mapping (/proc/PID/smaps) of exactly RandomX's size: the "
    "256 MiB cache or the dataset (2 GiB + 33554368 bytes, or 2080 MiB in 2 MiB pages; with "
    "1 GiB pages: one or three of them)",
    reads=("facts.hugetlb_mappings", "huge_requests"),
)
def huge_alloc_randomx_shape(s: ProcessState, now: float) -> bool:
    if any(_randomx_length(length, page) for length, page in s.huge_requests):
        return True
    mappings = s.facts.hugetlb_mappings if s.facts is not None else []
    return any(_randomx_length(length, page) for length, page in mappings)
