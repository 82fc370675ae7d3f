"""The agent's log records in every output format, and the list of those formats.

A :class:`~gpuguard.outputs.finding.Finding`, an
:class:`~gpuguard.events.agent_events.ActionOutcome` or an
:class:`~gpuguard.events.agent_events.AgentLifecycle` -> one line of text (no
newline), through the :class:`~gpuguard.outputs.output_format.OutputFormat`
named by the config.  A new format is one module plus one entry in :data:`OUTPUT_FORMATS`.
Every line is escaped and bounded (:mod:`gpuguard.outputs.bounds`): one record is
always one line, whatever a process calls itself.
"""

from __future__ import annotations

import socket
import time
from typing import Any

from gpuguard.events.agent_events import ActionOutcome, AgentLifecycle
from gpuguard.outputs import cef, ecs, ocsf
from gpuguard.outputs.bounds import OutputLimits, bound_evidence
from gpuguard.outputs.ecs import host_fields
from gpuguard.outputs.finding import Finding
from gpuguard.outputs.output_format import AGENT_DATASET, OutputFormat, Target

Record = Finding | ActionOutcome | AgentLifecycle
# Every output format, the default first.
OUTPUT_FORMATS: tuple[OutputFormat, ...] = (ecs.FORMAT, ocsf.FORMAT, cef.FORMAT)
FORMATS = tuple(f.name for f in OUTPUT_FORMATS)
BY_NAME = {f.name: f for f in OUTPUT_FORMATS}
SCAN_FORMATS = {f.scan_option: f for f in OUTPUT_FORMATS if f.scan_option}  # scan --format NAME


class RecordRenderer:
    """Renders records in one format for one host (host facts are read once), within ``limits``."""

    def __init__(
        self,
        fmt: str = "ecs",
        host: dict[str, Any] | None = None,
        limits: OutputLimits | None = None,
    ) -> None:
        if fmt not in BY_NAME:
            raise ValueError(f"unknown log format {fmt!r} (one of {', '.join(FORMATS)})")
        self.fmt = fmt
        self.format = BY_NAME[fmt]
        self.host = host or host_fields()
        self.hostname = self.host.get("hostname") or socket.gethostname()
        self.limits = limits or OutputLimits()
        self.target = Target(self.host, self.hostname, AGENT_DATASET)

    def document(self, record: Record) -> Any:
        """The format's document for ``record`` (exact values: no caps applied)."""
        if isinstance(record, Finding):
            return self.format.finding(record, _finding_time(record), self.target)
        if isinstance(record, ActionOutcome):
            return self.format.action(record, self.target)
        if isinstance(record, AgentLifecycle):
            return self.format.lifecycle(record, self.target)
        raise TypeError(f"not a log record: {type(record).__name__}")

    def line(self, record: Record) -> str:
        """One line of text (no trailing newline) of at most ``limits.record`` bytes."""

        def render(evidence: int) -> Any:
            if isinstance(record, Finding):
                return self.document(bound_evidence(record, evidence))
            return self.document(record)

        count = len(record.evidence) if isinstance(record, Finding) else 0
        return self.format.encode(render, count, self.limits)


def _finding_time(finding: Finding) -> float:
    """When the finding was made (the verdict's time); a finding without one is "now"."""
    return finding.created if finding.created else time.time()
