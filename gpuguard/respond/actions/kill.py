"""kill: SIGTERM the offender (its process group, or its container's cgroup), SIGKILL after a grace."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuguard.config.schema import Key
from gpuguard.events.action_kinds import KILL
from gpuguard.events.agent_events import ActionOutcome
from gpuguard.respond.actions.action import Action
from gpuguard.respond.cgroup_blocks import cgroup2_mount, cgroup2_of
from gpuguard.respond.process_control import (
    RecycledPid,
    open_process,
    process_group_members,
    start_time_of,
)

if TYPE_CHECKING:
    from gpuguard.correlate.state import ProcessState
    from gpuguard.detect.scoring.score import Verdict
    from gpuguard.respond.context import ActionContext


@dataclass(frozen=True, slots=True)
class KillSettings:
    """``response.kill``: the grace between SIGTERM and SIGKILL, and what is signalled."""

    kill_grace_s: float = 2.0
    kill_target: str = "process"  # process | group | cgroup


def run(
    ctx: ActionContext, verdict: Verdict, state: ProcessState, base: dict[str, Any]
) -> ActionOutcome:
    grace = ctx.options.kill_grace_s
    target = ctx.options.kill_target
    facts = state.facts
    if target == "cgroup" and not (facts and facts.container_id):
        target = "process"  # only a container's cgroup is ever killed whole
    detail = {"signal": "SIGTERM", "sigkill_after_s": grace, "target": target}
    if target == "cgroup":
        cgroup_dir = os.path.join(cgroup2_mount(), cgroup2_of(verdict.pid).lstrip("/"))
        detail.update(signal="cgroup.kill", cgroup=cgroup_dir)
        if ctx.dry_run:
            return ctx.would(f"write 1 to {cgroup_dir}/cgroup.kill", detail, base)
        with ctx.open_offender(verdict, state):
            Path(cgroup_dir, "cgroup.kill").write_text("1")
        return ActionOutcome(
            action=KILL.name,
            status="done",
            reason="killed every process of the container's cgroup",
            detail=detail,
            **base,
        )
    pids = [verdict.pid]
    if target == "group":
        pgid = os.getpgid(verdict.pid)
        detail["pgid"] = pgid
        pids += [
            p for p in process_group_members(pgid) if p != verdict.pid and not ctx.refusal(p, facts)
        ]
    if ctx.dry_run:
        return ctx.would(
            f"send SIGTERM to pid(s) {pids} (start time checked), SIGKILL after {grace:g} s",
            detail,
            base,
        )
    handle = ctx.open_offender(verdict, state)
    handle.send(signal.SIGTERM)
    others = []
    for pid in pids[1:]:
        try:
            other = open_process(pid, start_time_of(pid))
            other.send(signal.SIGTERM)
            others.append(other)
        except (RecycledPid, OSError):
            continue
    ctx.later(finish_kill, ctx, [handle, *others], grace, base, within_s=grace)
    return ActionOutcome(
        action=KILL.name,
        status="done",
        detail=detail,
        **base,
        reason=f"SIGTERM sent; SIGKILL after {grace:g} s unless it exits",
    )


def finish_kill(ctx: ActionContext, handles: list, grace: float, base: dict[str, Any]) -> None:
    deadline = time.monotonic() + grace
    for handle in handles:
        try:
            if not handle.wait_exit(deadline - time.monotonic()):
                handle.send(signal.SIGKILL)
                handle.wait_exit(1.0)
                ctx.report(
                    ActionOutcome(
                        **{**base, "time": time.time()},
                        action=KILL.name,
                        status="done",
                        reason=f"pid {handle.pid} ignored SIGTERM for {grace:g} s: SIGKILL sent",
                        detail={"signal": "SIGKILL"},
                    )
                )
        except ProcessLookupError:
            pass
        finally:
            handle.close()


ACTION = Action(
    KILL,
    run,
    section="kill",
    options=(
        Key(
            "grace_s",
            "number",
            "SIGTERM, then SIGKILL this long after",
            field="kill_grace_s",
            low=0,
        ),
        Key(
            "target",
            "choice",
            "process | group (its process group) | cgroup (every process in its cgroup)",
            field="kill_target",
            choices=("process", "group", "cgroup"),
        ),
    ),
    settings=KillSettings,
    default_on=("malicious",),
    what="SIGTERM, SIGKILL after `kill.grace_s` (2 s) unless it exits; `kill.target: group` "
    "signals its process group, `cgroup` writes `cgroup.kill` of its **container's** cgroup "
    "(a process outside a container is killed alone)",
)
