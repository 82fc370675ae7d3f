"""The action interface: what the agent calls when a process's verdict changes.

A responder is a callable ``(verdict, state, now) -> list[ActionOutcome]``.
``gpuguard.respond`` provides the real one (``Responder(settings, mode=,
dry_run=, emit=)``, with ``settings`` parsed from the config's ``response:``
section); until it is wired in, :class:`AlertOnlyResponder` is used: it
raises an alert for a suspicious or malicious verdict and, in enforce mode,
says plainly that no other action is available in this build.
:func:`make_responder` is the one place the agent picks its responder.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

from gpuguard.events.agent_events import ActionOutcome

ALERT_VERDICTS = ("suspicious", "malicious")


class ActionInterface(Protocol):
    def __call__(self, verdict: Any, state: Any, now: float) -> list[ActionOutcome]: ...


class AlertOnlyResponder:
    """Monitor mode (and enforce mode without the response layer): alerts only."""

    def __init__(self, mode: str = "monitor", dry_run: bool = False) -> None:
        self.mode, self.dry_run = mode, dry_run

    def __call__(self, verdict: Any, state: Any, now: float) -> list[ActionOutcome]:
        if verdict.verdict not in ALERT_VERDICTS:
            return []
        facts = getattr(state, "facts", None)
        common = dict(time=now, pid=verdict.pid, start_time=verdict.key.start_time,
                      comm=facts.comm if facts else verdict.comm, exe=facts.exe if facts else verdict.exe,
                      verdict=verdict.verdict, score=int(verdict.score),
                      rule_ids=[e.rule_id for e in verdict.evidence])
        outcomes = [ActionOutcome(action="alert", status="done", reason=f"{verdict.verdict} verdict", **common)]
        wanted = getattr(verdict, "action", "alert")
        if self.mode == "enforce" and wanted not in ("none", "alert"):
            outcomes.append(ActionOutcome(action=wanted, status="skipped",
                                          reason="the response layer (gpuguard.respond) is not part of this build",
                                          **common))
        return outcomes


def make_responder(response_settings: dict[str, Any], mode: str, dry_run: bool,
                   emit: Callable[[ActionOutcome], None]) -> ActionInterface:
    """The responder for this agent (the config's ``response:`` section is passed through untouched)."""
    del response_settings, emit    # the alert-only responder needs neither
    return AlertOnlyResponder(mode=mode, dry_run=dry_run)
