"""The user-space match: exec reports against the blocks' identities, and the offender's exact copies.

:class:`ExecIdentities` holds what each block names beyond the kernel's path key (device+inode,
size+sha256, a script's sha256) and matches a process that just exec'd against it: a renamed
copy, or a blocked script under any interpreter.  :class:`ExactCopies` says whether a process
blocked by path runs the offender's very file (or bytes): the offender's own, which the
breaker does not count.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from dataclasses import dataclass

from gpuguard.detect.ruleset.allowlist import sha256_of_file
from gpuguard.respond.touch.target import (
    BlockTarget,
    Script,
    descendants,
    interpreter_family,
    read_process,
    script_of,
    users_of,
)

MAX_OWN = 8192  # exact copies remembered (the blocks' processes)


@dataclass(slots=True)
class _Entry:
    number: int
    deadline: int  # monotonic ns, 0: never


class ExecIdentities:
    """The identities of the blocks in place, matched against exec reports (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # (dev, ino, size, mtime_ns): an inode number alone is handed out again after a delete
        self._inodes: dict[tuple[int, int, int, int], _Entry] = {}
        self._hashes: dict[int, dict[str, _Entry]] = {}  # exe size -> sha256 -> entry
        self._scripts: dict[str, _Entry] = {}  # script or inline-code sha256 -> entry

    def __bool__(self) -> bool:
        return bool(self._inodes or self._hashes or self._scripts)

    def add(self, number: int, deadline: int, target: BlockTarget) -> None:
        entry = _Entry(number, deadline)
        with self._lock:
            if target.kind == "executable" and target.identity:
                self._inodes[tuple(target.identity)] = entry
                if target.sha256:
                    self._hashes.setdefault(target.identity[2], {})[target.sha256] = entry
            elif target.kind == "script" and target.script and target.script.sha256:
                self._scripts[target.script.sha256] = entry

    def restore(self, number: int, deadline: int, detail: dict) -> None:
        """Re-add a block's identities from its stored detail (after a restart)."""
        target = detail.get("target") or {}
        script = target.get("script") or {}
        identity = detail.get("identity")
        self.add(
            number,
            deadline,
            BlockTarget(
                target.get("kind", "executable" if identity else "tree-only"),
                detail.get("exe", ""),
                tuple(identity) if identity else None,
                detail.get("sha256"),
                script=Script(script.get("kind", ""), script.get("path", ""), script.get("sha256"))
                if script
                else None,
            ),
        )

    def forget(self, number: int) -> None:
        with self._lock:
            self._inodes = {k: v for k, v in self._inodes.items() if v.number != number}
            self._hashes = {
                size: kept
                for size, by_hash in self._hashes.items()
                if (kept := {h: v for h, v in by_hash.items() if v.number != number})
            }
            self._scripts = {k: v for k, v in self._scripts.items() if v.number != number}

    def match(self, pid: int, now_ns: int) -> tuple[int, str] | None:
        """(block number, what matched) for the process ``pid`` that just exec'd, or None."""
        exe, st, argv = read_process(pid)
        with self._lock:
            entry = self._inodes.get((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
            by_size = self._hashes.get(st.st_size)
            scripts = bool(self._scripts)
        if entry is not None and _live(entry, now_ns):
            return entry.number, f"the blocked executable {exe} (same file)"
        if by_size:
            digest = sha256_of_file(f"/proc/{pid}/exe")
            entry = by_size.get(digest) if digest else None
            if entry is not None and _live(entry, now_ns):
                if interpreter_family(f"/proc/{pid}/exe") is not None:
                    return None  # an interpreter is never blocked, whatever its bytes
                if users_of((st.st_dev, st.st_ino), descendants(pid)):
                    return None  # a file others run: identical bytes alone do not make it ours
                return entry.number, f"a copy of a blocked executable ({exe}, same sha256)"
        if scripts:
            family = interpreter_family(f"/proc/{pid}/exe")
            if family is not None:
                script = script_of(family, argv, f"/proc/{pid}")
                if script.sha256:
                    with self._lock:
                        entry = self._scripts.get(script.sha256)
                    if entry is not None and _live(entry, now_ns):
                        what = script.path or "inline code"
                        return entry.number, f"a blocked script ({what}) run by {exe}"
        return None


def _live(entry: _Entry, now_ns: int) -> bool:
    return entry.deadline == 0 or now_ns < entry.deadline


class ExactCopies:
    """Which processes blocked by path run the offender's very file or bytes (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._files: dict[int, tuple[tuple, str | None]] = {}  # number -> (identity, sha256)
        self._own: OrderedDict[int, None] = OrderedDict()  # tgids found to be exact copies

    def add(self, number: int, identity: tuple | None, sha256: str | None) -> None:
        """The offender's file for block ``number`` (device, inode, size, mtime_ns and sha256)."""
        if identity:
            with self._lock:
                self._files[number] = (tuple(identity), sha256)

    def forget(self, number: int) -> None:
        with self._lock:
            self._files.pop(number, None)

    def check(self, tgid: int, path: str, number: int) -> bool:
        """Whether ``tgid``, which exec'd ``path`` under block ``number``, is an exact copy (kept).

        Decided from the file at the exec'd path (the kernel's report comes before any kill of
        that process, which may already be dead when this runs) and kept for its kill report.
        """
        with self._lock:
            blocked = self._files.get(number)
        if blocked is None:
            return False
        identity, sha256 = blocked
        try:
            st = os.stat(path)
        except OSError:
            return False
        exact = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) == identity or (
            st.st_size == identity[2] and sha256 is not None and sha256_of_file(path) == sha256
        )
        if not exact:
            return False
        with self._lock:
            self._own[tgid] = None
            while len(self._own) > MAX_OWN:
                self._own.popitem(last=False)
        return True

    def is_own(self, tgid: int) -> bool:
        with self._lock:
            return tgid in self._own
