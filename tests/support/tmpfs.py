"""A small tmpfs of a test's own (a full disk on demand), and a filler that takes its free pages."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def small_tmpfs(mnt: Path, size: str, name: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (e.g. ``16k``) mounted on ``mnt`` (made here) for the block."""
    mnt.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", f"{name}-{os.getpid()}", str(mnt)],
        check=True,
    )
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def fill(directory: Path, chunk: int = 4096) -> Path:
    """Take every free page of the file system under ``directory``; returns the filler file
    (remove it to give the space back)."""
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as out:
        while True:
            try:
                out.write(b"f" * chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                return filler
