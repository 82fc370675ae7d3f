"""Rule files: read with positions, merge layers, compile — every mistake as ``file:line:col``.

Three stages, as in ``gpuguard rules validate``:

1. **read** each file (here): a regular file of at most ``MAX_RULES_FILE_BYTES``
   (``filecheck``: never blocking on a FIFO or device), refused when an
   unprivileged user could have written it, parsed with positions and bounded
   depth and alias expansion (``yaml_marks``);
2. **collect** the layers in order and 3. **compile** them
   (:mod:`gpuguard.detect.ruleset.collect`) into the model
   (:mod:`gpuguard.detect.ruleset.model`).

:func:`load_ruleset` raises :class:`GpuguardError` with the first problem;
:func:`validate_rules` returns them all as :class:`Problem`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from gpuguard.config.filecheck import refusal_reason
from gpuguard.config.yaml_marks import MarkedDocument, load_marked_file
from gpuguard.detect.ruleset.collect import Collector, compile_collected
from gpuguard.detect.ruleset.model import (  # noqa: F401  (the model, re-exported for callers of the loader)
    ACTIONS,
    FORMAT_VERSION,
    MATURITIES,
    SEVERITIES,
    VERDICTS,
    Problem,
    Rule,
    RuleSet,
    Thresholds,
)
from gpuguard.detect.ruleset.shipped import default_rule_paths
from gpuguard.errors import GpuguardError

MAX_RULES_FILE_BYTES = 1 << 20  # the shipped rules are 16 KiB


def _check_and_read(paths: Sequence[Path]) -> tuple[list[MarkedDocument], list[Problem]]:
    docs, problems = [], []
    for path in paths:
        path = Path(path)
        # What it is first (a FIFO, a device, a directory: named as such, never opened blocking),
        # then whether root can trust it.
        reason = refusal_reason(path, "rules file")
        if reason:
            problems.append(Problem(str(path), 1, 1, reason[0], fix=reason[1]))
            continue
        try:
            docs.append(load_marked_file(path, MAX_RULES_FILE_BYTES))
        except GpuguardError as exc:
            problems.append(Problem(str(path), 1, 1, exc.cause, fix=exc.fix or None))
    return docs, problems


def _build(
    paths: Sequence[Path] | None, counting: str = MATURITIES[-1]
) -> tuple[RuleSet | None, list[Problem]]:
    paths = [Path(p) for p in (default_rule_paths() if paths is None else paths)]
    if not paths:
        return None, [Problem("-", 1, 1, "no rules files given")]
    docs, problems = _check_and_read(paths)
    if problems:
        return None, problems
    collector = Collector()
    for doc in docs:
        collector.add(doc)
    ruleset, problems = compile_collected(collector.out, paths, True, counting)
    order = {str(p): i for i, p in enumerate(paths)}
    problems.sort(key=lambda p: (order.get(p.file, len(order)), p.file, p.line, p.col))
    return ruleset, problems


def validate_rules(paths: Sequence[Path] | None = None) -> list[Problem]:
    """Every problem in the layered rule files (empty when they are valid)."""
    return _build(paths)[1]


def load_ruleset(paths: Sequence[Path] | None = None, maturity: str = MATURITIES[-1]) -> RuleSet:
    """Load and compile rule files (``None``: shipped + /etc/gpuguard/*.yaml); raises GpuguardError.

    ``maturity``: the lowest tier whose rules are evaluated (the agent's setting; every tier by
    default, as ``rules test`` and ``scan`` judge).
    """
    ruleset, problems = _build(paths, maturity)
    if ruleset is None:
        more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
        first = problems[0]
        if first.cause.startswith("refusing rules file"):
            raise GpuguardError(
                first.cause, first.fix or ""
            )  # names the file itself, with its own fix
        raise GpuguardError(
            f"invalid rules: {first}{more}",
            "correct the rules file; `gpuguard rules validate` lists every problem",
        )
    return ruleset
