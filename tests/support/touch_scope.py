"""A cgroup an enforce test scopes kill-on-touch to, and programs run in it (or outside) with GPU nodes.

:func:`scope_cgroup` makes ``/<cgroup2>/gg-touch-<pid>-<n>`` with a child ``inner``
and removes both (killing what is left) afterwards; :func:`start_in` runs a
program with GPU-named nodes in a private /dev, inside a cgroup from its first
instruction (or where the test runs, with ``None``).
"""

from __future__ import annotations

import itertools
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gpuguard.respond.cgroup_blocks import cgroup2_mount
from tests.support.cgroup_start import in_cgroup
from tests.support.workloads import private_dev_command

_COUNTER = itertools.count()


@contextmanager
def scope_cgroup() -> Iterator[tuple[str, Path]]:
    """(the cgroup's v2 path for ``response.cgroups``, its directory); it has a child ``inner``."""
    name = f"/gg-touch-{os.getpid()}-{next(_COUNTER)}-{time.monotonic_ns() % 100000}"
    cgroup = Path(cgroup2_mount() + name)
    cgroup.mkdir()
    (cgroup / "inner").mkdir()
    try:
        yield name, cgroup
    finally:
        for top, _, _ in os.walk(cgroup, topdown=False):
            directory = Path(top)
            if (directory / "cgroup.procs").read_text().strip():
                (directory / "cgroup.kill").write_text("1")
                deadline = time.monotonic() + 5
                while (directory / "cgroup.procs").read_text().strip():
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.05)
            directory.rmdir()


def start_in(argv: list[str], cgroup: Path | None, **popen_kwargs) -> subprocess.Popen:
    """``argv`` with GPU-named nodes in a private /dev, in ``cgroup`` from its first instruction."""
    command, env = private_dev_command(argv)
    command = in_cgroup(command, cgroup)
    for stream in ("stdin", "stdout", "stderr"):
        popen_kwargs.setdefault(stream, subprocess.PIPE)
    return subprocess.Popen(command, env=env, **popen_kwargs)


def run_in(argv: list[str], cgroup: Path | None) -> tuple[int, str, int]:
    """(exit status, stdout, pid) of the gpu_workload steps ``argv``; "done" on stdout only if
    every step returned to the program (a "ready" step is added last)."""
    proc = start_in([*argv, "ready"], cgroup)
    out, _ = proc.communicate(b"\n", timeout=20)
    return proc.returncode, out.decode().replace("ready\n", "done"), proc.pid
