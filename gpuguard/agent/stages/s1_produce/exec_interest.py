"""Program names the rules score at exec; the exec filter sends those execs up in full.

The rules' lists are read as they are: a plain entry ("xmrig", "nbminer") is a program name.
Globs, regular expressions and paths cannot be hashed in the kernel, and a directory such as
``temp_exec_paths``' "/tmp/*" is not a reason to read a process that ends within the filter's
age: a process they would match goes up once it lives past that age, connects, opens a GPU or
asks for huge pages (gpuguard/sources/ebpf/exec_filter.py), and is scored then.  Shells are left
out: a flood of ``sh -c`` is the very thing the filter keeps in the kernel, and what a shell runs
is judged on its own exec.
"""

from __future__ import annotations

from typing import Any

_PATTERN_CHARS = set("*?[]()^$\\|+{}")
_NEVER = {"sh", "bash", "dash", "ash", "zsh", "busybox", "env", "true", "false"}


def exec_interest(ruleset: Any) -> list[str]:
    """The program names in ``ruleset.lists``, lower case; see the module docstring."""
    never = _NEVER | {str(v).lower() for v in ruleset.lists.get("shells", [])}
    names: set[str] = set()
    for values in ruleset.lists.values():
        for value in values:
            if not isinstance(value, str) or not value or len(value) > 64 or " " in value:
                continue
            if _PATTERN_CHARS & set(value) or "/" in value:
                continue
            if value.lower() not in never:
                names.add(value.lower())
    return sorted(names)
