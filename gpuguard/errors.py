"""The one error type every command turns into a single line and exit code 2.

Anything a user can get wrong (no root, no BPF, a broken rules file, a missing
GPU library, a corrupt recording) is raised as :class:`GpuguardError` with the
cause and the fix; the CLI prints ``gpuguard: <cause> (fix: <fix>)`` and exits 2
instead of showing a traceback.
"""

from __future__ import annotations


def with_fix(cause: str, fix: str | None) -> str:
    """``cause (fix: fix)``, or the cause alone: the one place that format is written."""
    return f"{cause} (fix: {fix})" if fix else cause


class GpuguardError(Exception):
    """A problem the user can fix: a cause and how to fix it."""

    exit_code = 2

    def __init__(self, cause: str, fix: str = "") -> None:
        super().__init__(cause)
        self.cause = cause
        self.fix = fix

    def one_line(self) -> str:
        from gpuguard.escape import escape_text

        return with_fix(escape_text(self.cause), escape_text(self.fix) if self.fix else None)


def dotted(path: tuple) -> str:
    """A config path as written in messages: ``("response", "hooks", 0, "argv")`` ->
    ``response.hooks[0].argv``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


class Problems:
    """What is wrong in one config file: raised at the first problem (the agent), or every
    problem collected (``gpuguard config validate``).

    ``locate(path, key)`` names where ``path`` is (``file:line:col``; ``key``: the mapping key
    rather than its value); without it, the file name alone.
    """

    def __init__(self, source: str, *, collect: bool = False, locate=None) -> None:
        self.source = source
        self.collect = collect
        self.locate = locate or (lambda path, key=False: source)
        self.found: list[str] = []

    def add(self, path: tuple, message: str, *, key: bool = False) -> None:
        """One problem at ``path``: raised as :class:`GpuguardError`, or kept when collecting."""
        line = f"{self.locate(path, key)}: {dotted(path)}: {message}"
        if not self.collect:
            raise GpuguardError(line, f"fix {self.source}")
        self.found.append(line)
