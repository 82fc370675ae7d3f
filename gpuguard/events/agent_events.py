"""Events the agent itself produces: what a response action did, and its own lifecycle.

The kernel and the samplers report what processes do (``events.model``); these
two report what gpuguard did about it.  ``gpuguard.respond`` produces
:class:`ActionOutcome` for every action it takes, refuses, fails or only
describes (dry run); the agent produces :class:`AgentLifecycle` for start,
reload, stop, drops and its own faults.  Both are plain data so every output
(ECS, OCSF, CEF, the console) renders them without importing the layer that
made them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

# What an action ended as.  "dry-run": described, not done; "refused": a safety
# rule (pid 1, kernel thread, gpuguard itself, allowlist, scope) forbade it;
# "rate-limited": the action budget was spent, so it degraded to an alert.
ACTION_STATUSES = ("done", "dry-run", "refused", "failed", "skipped", "rate-limited")


@dataclass(slots=True)
class ActionOutcome:
    """One response action and how it ended, for the action log."""

    time: float
    action: str  # an ActionKind's name (gpuguard.events.action_kinds)
    status: str  # one of ACTION_STATUSES
    pid: int = 0
    start_time: float = 0.0
    comm: str = ""
    exe: str = ""
    verdict: str = ""
    score: int = 0
    rule_ids: list[str] = field(default_factory=list)
    reason: str = ""  # why it was taken, or why not
    block_id: str | None = None  # the entry `gpuguard blocks` lists, when the action left one
    expires: float | None = None  # when that block lifts itself (epoch seconds), None for never
    detail: dict[str, Any] = field(
        default_factory=dict
    )  # action-specific: signal, cgroup, addresses, hook output

    def to_json(self) -> dict[str, Any]:
        return {"kind": "action", **dataclasses.asdict(self)}


# What an AgentLifecycle says happened, in the order docs/siem.md ("Lifecycle vocabulary")
# explains them.  "start-failed": start-up was refused (a bad config, the port in use); it
# stands where the start would, and no stop follows it.
LIFECYCLE_ACTIONS = (
    "start",
    "start-failed",
    "reload",
    "reload-failed",
    "stop",
    "drops",
    "degraded",
    "fault",
    "recovered",
    "host-change",
    "source-absent",
)


@dataclass(slots=True)
class AgentLifecycle:
    """Something that happened to the agent itself: start, reload, stop, drops, faults."""

    time: float
    action: str  # one of LIFECYCLE_ACTIONS
    message: str = ""
    detail: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"kind": "lifecycle", **dataclasses.asdict(self)}
