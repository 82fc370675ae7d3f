"""Commands run as nobody that reach this checkout even where its path is closed to nobody.

A checkout under a directory only root may enter (mode 0700, such as /root) keeps nobody out
of the package and the venv: ``setpriv --reuid=65534 .venv/bin/python -m gpuguard`` fails
before gpuguard runs.  :func:`as_nobody` is the argv prefix every test that runs something as
nobody uses.  Where the checkout is open to nobody it is plain setpriv.  Where it is closed,
the command first gets a private mount namespace in which the outermost closed directory is an
empty tmpfs (mode 0755) holding only the checkout (and the venv, where that lies elsewhere),
each bound back in at its own path.  So every path stays the same (sys.executable, the venv's
editable finder, REPO), nothing is copied, and the host's mounts are untouched.
"""

from __future__ import annotations

import functools
import shlex
import sys
from collections.abc import Iterable
from pathlib import Path

NOBODY = 65534  # uid and gid (nogroup)
REPO = Path(__file__).resolve().parents[2]
# What a gpuguard run as nobody reads: the checkout, and the venv's interpreter and packages.
REACH = (REPO, Path(sys.prefix), Path(sys.executable).parent)
# Where a namespace holds a path while it covers the closed directory above it (mount points
# only: each namespace's mounts are its own, so every run on the host may share them).
HOLD_DIR = Path("/run/gpuguard-test-reach")


def _searchable(directory: Path, uid: int = NOBODY, gid: int = NOBODY) -> bool:
    st = directory.stat()
    bit = 0o100 if st.st_uid == uid else 0o010 if st.st_gid == gid else 0o001
    return bool(st.st_mode & bit)


def closed_directory(path: Path) -> Path | None:
    """The outermost directory on the way to ``path`` (itself included) nobody may not search."""
    path = path.resolve()
    return next((d for d in [*reversed(path.parents), path] if not _searchable(d)), None)


def reach_steps(paths: Iterable[Path]) -> str | None:
    """Shell steps that, in a fresh mount namespace, open the way to ``paths`` for nobody;
    None when nobody reaches them already."""
    wanted = sorted({p.resolve() for p in paths})
    wanted = [p for p in wanted if not any(q in p.parents for q in wanted)]  # outermost only
    closed = {p: c for p in wanted if (c := closed_directory(p)) is not None}
    if not closed:
        return None
    for path in closed:
        if not _searchable(path):  # a bind carries the directory's own mode: nothing to open
            raise RuntimeError(
                f"{path} itself is closed to nobody (mode {path.stat().st_mode & 0o777:o}) "
                f"(fix: chmod o+rx {path}; a closed directory above it is fine)"
            )
    covers = {c for c in closed.values() if not any(d in c.parents for d in closed.values())}
    HOLD_DIR.mkdir(mode=0o700, exist_ok=True)
    holds = {path: HOLD_DIR / str(i) for i, path in enumerate(closed)}
    steps = []
    for path, hold in holds.items():
        hold.mkdir(exist_ok=True)
        steps.append(f"mount --rbind {shlex.quote(str(path))} {shlex.quote(str(hold))}")
    for cover in sorted(covers):
        steps.append(f"mount -t tmpfs -o mode=0755 gg-reach {shlex.quote(str(cover))}")
    for path, hold in holds.items():
        steps.append(f"mkdir -p {shlex.quote(str(path))}")
        steps.append(f"mount --rbind {shlex.quote(str(hold))} {shlex.quote(str(path))}")
    return " && ".join(steps)


@functools.cache
def _checkout_steps() -> str | None:
    return reach_steps(REACH)


def as_nobody(*setpriv_options: str, reach: Iterable[Path] | None = None) -> tuple[str, ...]:
    """The argv prefix that runs a command as nobody (uid and gid 65534, no supplementary
    groups, ``setpriv_options`` such as capabilities) able to reach ``reach`` (by default this
    checkout and its venv).  Root only, as setpriv is."""
    setpriv = ("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups")
    steps = _checkout_steps() if reach is None else reach_steps(reach)
    if steps is None:
        return (*setpriv, *setpriv_options)
    # unshare execs sh, sh execs setpriv, setpriv execs the command: one pid throughout.
    return (
        "unshare", "--mount", "--propagation", "private", "--",
        "sh", "-c", f'{steps} && exec "$@"', "gg-reach", *setpriv, *setpriv_options,
    )  # fmt: skip
