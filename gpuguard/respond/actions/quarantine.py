"""quarantine: deny GPU device majors to the offender's cgroup (its container's, or one it is put in)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpuguard.events.action_kinds import QUARANTINE
from gpuguard.events.agent_events import ActionOutcome
from gpuguard.respond.actions.action import Action, Option, name_block, note_exit_during_move
from gpuguard.respond.cgroup_blocks import QUARANTINE_BLOCK
from gpuguard.sources.proc.identity import pidfd_alive

if TYPE_CHECKING:
    from gpuguard.correlate.state import ProcessState
    from gpuguard.detect.scoring.score import Verdict
    from gpuguard.respond.responder import Responder


def run(r: Responder, verdict: Verdict, state: ProcessState, base: dict[str, Any]) -> ActionOutcome:
    container = bool(state.facts and state.facts.container_id)
    if r.dry_run:
        return ActionOutcome(
            action=QUARANTINE.name,
            status="dry-run",
            detail={"container": container},
            **base,
            reason="would deny GPU device majors to "
            + ("its container's cgroup" if container else "a gpuguard cgroup it is moved into"),
        )
    with r.open_offender(verdict, state) as handle:
        block = r.cgroup_blocker().quarantine(
            verdict.pid, container, r.settings.quarantine_ttl_s, f"{verdict.verdict} verdict"
        )
        moved_alive = pidfd_alive(handle.pidfd)
    name_block(block, verdict)
    remain = block.detail["open_gpu_fds"]
    outcome = r.placed(
        block,
        QUARANTINE.name,
        f"GPU opens now fail with EPERM; {remain} GPU fd(s) it already holds "
        "remain open (pair with suspend or kill)",
        base,
    )
    return note_exit_during_move(outcome, moved_alive)


ACTION = Action(
    QUARANTINE,
    run,
    section="quarantine",
    options=(
        Option("ttl_s", "quarantine_ttl_s", "number"),
        Option("cgroup_parent", "quarantine_parent", "text"),
    ),
    blocks=(QUARANTINE_BLOCK,),
)
