"""Rule signals of YARA matches on its executable, command line, environment or memory."""

from __future__ import annotations

from gpuguard.correlate.state import ProcessState
from gpuguard.detect.signals.definition import signal


@signal(
    "yara_rules",
    "texts",
    "yara",
    "YARA rules that matched its executable, command line, environment or memory",
    reads=("yara_matches",),
)
def yara_rules(s: ProcessState, now: float) -> set[str]:
    return s.yara_matches


@signal("yara_tags", "texts", "yara", "tags of the YARA rules that matched", reads=("yara_tags",))
def yara_tags(s: ProcessState, now: float) -> set[str]:
    return s.yara_tags
