"""Names and directories the rules score at exec; the exec filter sends those execs up in full.

The rules' lists are read as they are: a plain entry ("xmrig", "nbminer") is a program name,
an entry "/dir/*" (``temp_exec_paths``) a directory whose executables matter.  Globs and
regular expressions cannot be hashed in the kernel; a process they would match still goes
up once it lives past the filter's age, connects, opens a GPU or asks for huge pages
(gpuguard/sources/ebpf/exec_filter.py).  Shells are left out: a flood of ``sh -c`` is the very
thing the filter keeps in the kernel, and what a shell runs is judged on its own exec.
"""

from __future__ import annotations

from typing import Any

_PATTERN_CHARS = set("*?[]()^$\\|+{}")
_NEVER = {"sh", "bash", "dash", "ash", "zsh", "busybox", "env", "true", "false"}


def exec_interest(ruleset: Any) -> tuple[list[str], list[str]]:
    """(names, directories) from ``ruleset.lists``; see the module docstring."""
    never = _NEVER | {str(v).lower() for v in ruleset.lists.get("shells", [])}
    names: set[str] = set()
    directories: set[str] = set()
    for values in ruleset.lists.values():
        for value in values:
            if not isinstance(value, str) or not value or len(value) > 64 or " " in value:
                continue
            if value.startswith("/") and value.endswith("/*"):
                head = value[:-2]
                if head and not (_PATTERN_CHARS & set(head)):
                    directories.add(head)
                continue
            if _PATTERN_CHARS & set(value) or "/" in value:
                continue
            if value.lower() not in never:
                names.add(value.lower())
    return sorted(names), sorted(directories)
