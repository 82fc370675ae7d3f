"""What every stage of the agent shares: the live config, counters, log, stop flag and intake."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuguard.agent.config import AgentConfig
from gpuguard.agent.counters import AgentCounters
from gpuguard.agent.intake import BoundedQueue
from gpuguard.agent.telemetry import AgentTelemetry
from gpuguard.events.agent_events import AgentLifecycle


def stderr_line(line: str) -> None:
    """One line to stderr, never raising (the agent's default ``stderr``)."""
    try:
        os.write(2, (line + "\n").encode("utf-8", "backslashreplace"))
    except OSError:
        pass


@dataclass(eq=False)
class AgentContext:
    """Cross-cutting parts; ``config`` is replaced on a SIGHUP reload."""

    config: AgentConfig
    counters: AgentCounters
    telemetry: AgentTelemetry  # the log and the metrics
    intake: BoundedQueue  # what the producers queued for the loop
    stop: threading.Event
    stderr: Callable[[str], None]
    proc_root: str = "/proc"
    status_soon: bool = False  # something the state file says changed: write it this turn

    def emit(self, record: Any) -> None:
        """Queue a record for the log (any thread)."""
        self.telemetry.write(record)

    def lifecycle(self, action: str, message: str, **detail: Any) -> None:
        self.emit(AgentLifecycle(time=time.time(), action=action, message=message, detail=detail))
