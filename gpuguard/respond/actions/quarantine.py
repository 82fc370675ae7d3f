"""quarantine: deny GPU device majors to the offender's cgroup (its container's, or one it is put in)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpuguard.config.schema import Key
from gpuguard.events.action_kinds import QUARANTINE
from gpuguard.events.agent_events import ActionOutcome
from gpuguard.respond.actions.action import (
    Action,
    cgroup_programs,
    load_cgroup_programs,
    name_block,
    note_exit_during_move,
)
from gpuguard.respond.cgroup_blocks import QUARANTINE_BLOCK
from gpuguard.sources.proc.identity import pidfd_alive

if TYPE_CHECKING:
    from gpuguard.correlate.state import ProcessState
    from gpuguard.detect.scoring.score import Verdict
    from gpuguard.respond.context import ActionContext


@dataclass(frozen=True, slots=True)
class QuarantineSettings:
    """``response.quarantine``: how long, and where gpuguard makes the cgroups it moves into."""

    quarantine_ttl_s: float = 0.0  # 0: until `gpuguard unblock`
    # cgroup v2 dir for the cgroups gpuguard creates ("": <cgroup2>/gpuguard); block-egress's too
    quarantine_parent: str = ""


def run(
    ctx: ActionContext, verdict: Verdict, state: ProcessState, base: dict[str, Any]
) -> ActionOutcome:
    container = bool(state.facts and state.facts.container_id)
    if ctx.dry_run:
        return ctx.would(
            "deny GPU device majors to "
            + ("its container's cgroup" if container else "a gpuguard cgroup it is moved into"),
            {"container": container},
            base,
        )
    with ctx.open_offender(verdict, state) as handle:
        block = ctx.part(cgroup_programs).quarantine(
            verdict.pid, container, ctx.options.quarantine_ttl_s, f"{verdict.verdict} verdict"
        )
        moved_alive = pidfd_alive(handle.pidfd)
    name_block(block, verdict)
    remain = block.detail["open_gpu_fds"]
    outcome = ctx.placed(
        block,
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
        Key("ttl_s", "number", "0: until `gpuguard unblock`", field="quarantine_ttl_s", low=0),
        Key(
            "cgroup_parent",
            "text",
            'cgroup v2 dir for the cgroups gpuguard creates ("": <cgroup2>/gpuguard)',
            field="quarantine_parent",
        ),
    ),
    settings=QuarantineSettings,
    blocks=(QUARANTINE_BLOCK,),
    start=load_cgroup_programs,
    what="a cgroup device program on the offender's container cgroup (or on a cgroup of its own "
    "that gpuguard creates under `quarantine.cgroup_parent` and moves it into) denies the GPU "
    "device majors: NVIDIA 195, DRM 226 and the dynamic majors of nvidia-uvm, nvidia-caps and "
    "kfd from /proc/devices. Opens fail with EPERM; the process keeps running. **GPU fds it "
    "already holds stay open**: the outcome says how many; pair it with `suspend` or `kill`",
    undone_by="`quarantine.ttl_s` (0: never), `unblock`",
)
