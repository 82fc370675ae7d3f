"""The action interface: what the report stage hands the act stage, and the responder it calls.

An :class:`Alert` is what the report stage returns for each finding to act on; the
pipeline hands them to the act stage.  A responder is a callable
``(verdict, state, now, finding) -> list[ActionOutcome]`` returning the outcomes known at
once (the agent logs them); outcomes that come later (SIGKILL after the grace period, hook
results, kill-on-touch kills) reach the agent through ``emit``.  :func:`make_responder` is
the one place the agent builds it: ``gpuguard.respond.Responder`` with the config's
``response:`` section, already checked when the config was loaded
(:mod:`gpuguard.agent.config`).  In monitor mode (the default) the responder never acts: it
raises the alert and names what enforce mode would do.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuguard.correlate.state import ProcessState
from gpuguard.events.agent_events import ActionOutcome
from gpuguard.respond import Responder, ResponseSettings
from gpuguard.sources.proc.identity import ExitGenerations
from gpuguard.sources.proc.pod_names import PodNames


@dataclass(frozen=True, slots=True)
class Alert:
    """A finding to act on: its verdict, the process's state then, and its document (hooks)."""

    verdict: Any  # gpuguard.detect.scoring.score.Verdict (a rule or guard-policy verdict)
    state: ProcessState | None
    finding: dict[str, Any]


def make_responder(
    settings: ResponseSettings,
    mode: str,
    dry_run: bool,
    emit: Callable[[ActionOutcome], None],
    generations: ExitGenerations | None = None,
    pod_names: PodNames | None = None,
) -> Responder:
    """The responder for this agent; close the previous one before building another.
    ``generations``: the sensor's exit generations, so actions reach exactly the process
    whose exec was seen (see gpuguard.sources.proc.identity)."""
    return Responder(
        settings,
        mode=mode,
        dry_run=dry_run,
        emit=emit,
        generations=generations,
        pod_names=pod_names,
    )
