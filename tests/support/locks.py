"""A file lock every test run on the host shares (two workers, or two checkouts, alike)."""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def host_lock(path: Path, mode: int = fcntl.LOCK_EX) -> Iterator[None]:
    """``path`` locked (``fcntl.LOCK_EX`` or ``LOCK_SH``) while inside; made if missing."""
    with open(path, "a") as lock:
        fcntl.flock(lock, mode)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
