"""Rule signals of a process's ancestry: its parent's and ancestors' names, exes and verdict."""

from __future__ import annotations

from gpuguard.correlate.state import ProcessState
from gpuguard.detect.signals.definition import signal
from gpuguard.detect.signals.parsed import basename


def _ancestors(s: ProcessState) -> list:
    return s.facts.ancestors if s.facts is not None else []


@signal("parent_name", "text", "ancestry", "parent's comm, lower-case", reads=("facts.ancestors",))
def parent_name(s: ProcessState, now: float) -> str | None:
    a = _ancestors(s)
    return a[0].comm.lower() if a else None


@signal("parent_exe", "text", "ancestry", "parent's executable", reads=("facts.ancestors",))
def parent_exe(s: ProcessState, now: float) -> str | None:
    a = _ancestors(s)
    return (a[0].exe or None) if a else None


@signal(
    "ancestor_names",
    "texts",
    "ancestry",
    "comm and executable names of all ancestors (up to 8), lower-case",
    reads=("facts.ancestors",),
)
def ancestor_names(s: ProcessState, now: float) -> set[str]:
    names = {a.comm.lower() for a in _ancestors(s)} | {
        basename(a.exe).lower() for a in _ancestors(s)
    }
    names.discard("")
    return names


@signal(
    "ancestor_exes", "texts", "ancestry", "executables of all ancestors", reads=("facts.ancestors",)
)
def ancestor_exes(s: ProcessState, now: float) -> set[str]:
    return {a.exe for a in _ancestors(s) if a.exe}


@signal(
    "parent_verdict",
    "text",
    "ancestry",
    "the parent's current verdict (clean, suspicious, malicious)",
    reads=("parent_verdict",),
)
def parent_verdict(s: ProcessState, now: float) -> str | None:
    return s.parent_verdict.verdict if s.parent_verdict is not None else None


@signal(
    "parent_score", "number", "ancestry", "the parent's current score", reads=("parent_verdict",)
)
def parent_score(s: ProcessState, now: float) -> int | None:
    return s.parent_verdict.score if s.parent_verdict is not None else None
