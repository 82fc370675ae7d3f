"""What a kill record names: each blocked process's executable and command line, kept while it lives.

A victim is gone before /proc could be read, so the kill record names it from what the kernel
kept (``touch_procs``), else from what was learnt here at its exec report or at the block's
placement, else the offender's.  Command lines are escaped and bounded.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict

from gpuguard.escape import escape_text

MAX_KNOWN = 8192  # victims' exe/cmdline remembered (the blocks' processes)
CMDLINE_CAP = 4096  # bytes of a victim's command line kept in its kill record


def args_text(raw: bytes, cut: bool) -> str:
    """A NUL-separated argv (as /proc/PID/cmdline holds it) as one escaped line."""
    text = escape_text(raw.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace"))
    return text + (" [truncated]" if cut else "")


def raw_cmdline(pid: int, cap: int = CMDLINE_CAP) -> tuple[bytes, bool]:
    """Up to ``cap`` bytes of the process's argv, and whether it was longer."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read(cap + 1)
    except OSError:
        return b"", False
    return raw[:cap], len(raw) > cap


def cmdline_of(pid: int) -> str:
    return args_text(*raw_cmdline(pid))


def exe_of(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return ""


class KnownProcesses:
    """What each blocked process and each block's offender runs (exe, command line); thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._known: OrderedDict[int, tuple[str, str]] = OrderedDict()  # tgid -> (exe, cmdline)
        self._offenders: dict[int, tuple[str, str]] = {}  # block number -> the offender's

    def offender(self, number: int, exe: str, cmdline: str) -> None:
        with self._lock:
            self._offenders[number] = (exe, cmdline)

    def remember(self, tgid: int, exe: str, cmdline: str) -> None:
        with self._lock:
            self._known[tgid] = (exe, cmdline)
            self._known.move_to_end(tgid)
            while len(self._known) > MAX_KNOWN:
                self._known.popitem(last=False)

    def forget(self, number: int) -> None:
        with self._lock:
            self._offenders.pop(number, None)

    def victim(self, tgid: int, number: int, kept_exe: str, kept_cmdline: str) -> tuple[str, str]:
        """(exe, command line) of a killed process: what the kernel kept, else what is known here."""
        with self._lock:
            known = self._known.get(tgid)
            offender = self._offenders.get(number, ("", ""))
        exe = kept_exe or (known[0] if known else "") or offender[0]
        cmdline = kept_cmdline or (known[1] if known else "") or cmdline_of(tgid)
        return exe, cmdline
