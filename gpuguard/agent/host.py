"""What start-up and teardown ask of the agent they run for: a protocol, not the pipeline itself.

:class:`gpuguard.agent.pipeline.Agent` is the one agent that meets it; the steps in
:mod:`.startup` and :mod:`.teardown` know only this, so neither imports the pipeline.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from gpuguard.agent.context import AgentContext
from gpuguard.agent.wiring import AgentParts, Opened


@dataclass(frozen=True)
class StartRefused:
    """Start-up stopped: the step that raised, and what it raised (logged as ``start-failed``)."""

    step: str
    error: BaseException


class AgentHost(Protocol):
    """The agent as its start-up steps and teardown see it."""

    ctx: AgentContext
    parts: AgentParts
    opened: Opened  # what start-up opened so far
    ready: threading.Event  # set once start-up finished
    install_signals: bool
    unfed: list  # the rest of a batch a stop cut short
    refused: StartRefused | None  # start-up failed: in which step, and why

    def request_stop(self) -> None: ...

    def request_reload(self) -> None: ...

    def feed(self, items: list, cut: Callable[[], bool] | None = None) -> list:
        """Enrich and correlate ``items``; what ``cut()`` left unfed."""
        ...

    def score_and_report(self, now: float) -> None:
        """Score, report and act, in flow order."""
        ...
