"""A program in cgroups from its first instruction: a shell moves itself in, then execs it.

A process moved into a cgroup after it started ran its first instructions (and may have
forked) outside it; a test whose assertion is per cgroup (a scope, a count kept in the kernel
per cgroup) needs the program inside before it runs.  The shell writes its own pid into each
group's ``cgroup.procs`` and then execs the program, which keeps the shell's pid.
"""

from __future__ import annotations

from pathlib import Path

_JOIN = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 126; shift; done; shift; exec "$@"'


def in_cgroups(argv: list[str], *procs: Path | None) -> list[str]:
    """``argv`` preceded by the shell that joins each ``cgroup.procs`` file in ``procs`` (v1 or
    v2; None: none there to join; a failed join exits 126 without running ``argv``)."""
    joins = [str(p) for p in procs if p is not None]
    return ["/bin/sh", "-c", _JOIN, "gg-join", *joins, "--", *argv]


def in_cgroup(argv: list[str], cgroup: Path | None) -> list[str]:
    """``argv`` in the cgroup v2 directory ``cgroup`` from its first instruction (None: as it is)."""
    return argv if cgroup is None else in_cgroups(argv, Path(cgroup) / "cgroup.procs")
