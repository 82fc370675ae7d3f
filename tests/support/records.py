"""One log record rendered on its own, as the agent's log writer renders it."""

from __future__ import annotations

from typing import Any

from gpuguard.outputs.bounds import OutputLimits
from gpuguard.outputs.records import Record, RecordRenderer


def render_record(
    record: Record,
    fmt: str = "ecs",
    host: dict[str, Any] | None = None,
    limits: OutputLimits | None = None,
) -> str:
    """One log line for ``record`` in ``fmt`` (``ecs``, ``ocsf`` or ``cef``), within ``limits``."""
    return RecordRenderer(fmt, host, limits).line(record)
